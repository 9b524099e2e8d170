"""coordd on a PostgreSQL store (`--store postgresql://...`): the active coordd, or its standby.

Start-up: take the socket path's lock (coordd.serving: a standby on the active's host and
socket is refused at once, never left to find the path taken at fail-over), then the
coordinator's session advisory lock (coordd.store.postgres.leader) on a connection of its
own; while another coordd holds it, wait ("standby: waiting for the active coordd") with
no listener open. Once it is ours: open the socket (and `listen_tcp`), open the store,
give stored leases the restart grace, serve StoreCoordinator, reap every
`reaper_interval_s`. The rule not to break: a coordd whose lock session is gone exits at
once (exit code 3), so two coordds never serve the same store.
SIGTERM/SIGINT: the orderly shutdown of coordd.serving, then the lock is given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from coordd import errors
from coordd.clock import Clock
from coordd.config import Config
from coordd.listener import Listener
from coordd.serving import ServingDaemon, StartupError, lock_socket, sd_notify
from coordd.store_service import StoreCoordinator

logger = logging.getLogger(__name__)

EXIT_LEADERSHIP_LOST = 3
LEADER_KEY = "coordd"


def store_address(dsn: str) -> str:
    """Where a libpq URI points, for messages: `host H, port P, database D` (the query's
    `host=`/`port=`/`dbname=` win, as in libpq; libpq's defaults where absent). Never the
    user or password."""
    try:
        url = urllib.parse.urlsplit(dsn)
        query = urllib.parse.parse_qs(url.query)
        host = query.get("host", [url.hostname or ""])[0] or "the default socket folder"
        port = query.get("port", [str(url.port or "")])[0] or "5432"
    except ValueError:
        return "an unreadable DSN"
    db = query.get("dbname", [url.path.lstrip("/")])[0] or "the user's name"
    return f"host {host}, port {port}, database {db}"


class StoreDaemon(ServingDaemon):
    """coordd over a Store chosen by `config.store` (PostgreSQL), with leadership.

    Args:
        config: settings; `config.store` (the DSN) and `config.socket` must be set.
        clock: the clock (SystemClock in production).
        config_path: the config file, re-read on SIGHUP (coordd.reload).
    """

    serving_status = "serving (active)"

    def __init__(self, config: Config, clock: Clock | None = None,
                 config_path: str | None = None) -> None:
        try:
            from coordd.store.postgres import PostgresStore
            from coordd.store.postgres.leader import Leadership, pool_settings
        except ImportError as exc:
            raise StartupError(f"the PostgreSQL store needs asyncpg (pip install -e "
                               f"'.[postgres]'): {exc}") from exc
        super().__init__(config, clock, config_path)
        self.store = PostgresStore(config.store, aging_s=config.aging_interval_s,
                                   server_settings=pool_settings(
                                       config.store_session_timeout_s))
        self.coord = StoreCoordinator(self.store, config, self.clock)
        self.leader = Leadership(config.store, LEADER_KEY, config.store_session_timeout_s)

    def _handle(self, method: str, params: Any) -> Any:
        return self.coord.handle(method, params)

    def _ready_note(self) -> str:
        return "PostgreSQL store"

    def _lock_socket(self, path: Path) -> int:
        try:
            return lock_socket(path)
        except StartupError as exc:
            if "lock held" not in str(exc):
                raise
            raise StartupError(f"socket {path} is in use by a running coordd (the active "
                               "one?): a standby on the same host needs a --socket of its "
                               "own") from None

    async def run(self) -> None:
        """Wait for leadership, then serve until `stop_event` is set; exit the process
        (EXIT_LEADERSHIP_LOST) the moment leadership is lost.

        Raises: StartupError (the store cannot be reached, the socket cannot be used).
        """
        try:
            await super().run()
        finally:
            await self.leader.close()

    async def _before_listen(self) -> bool:
        """Hold the coordinator lock; False if stopped while waiting for it."""
        try:
            if await self.leader.try_acquire():
                return True
        except Exception as exc:  # OSError, asyncpg errors: the store is unreachable
            raise StartupError(f"cannot reach the store ({store_address(self.config.store)}): "
                               f"{type(exc).__name__}: {exc}") from exc
        logger.info("standby: waiting for the active coordd", extra={"action": "standby"})
        sd_notify("READY=1\nSTATUS=standby: waiting for the active coordd")
        acquire = asyncio.ensure_future(self.leader.acquire())
        stop = asyncio.ensure_future(self.stop_event.wait())
        await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not acquire.done():
            acquire.cancel()
            await asyncio.gather(acquire, return_exceptions=True)
            logger.info("standby stopped (it never served)", extra={"action": "stopped"})
            return False
        acquire.result()
        logger.info("standby: the active coordd's session ended; taking over",
                    extra={"action": "takeover"})
        return True

    async def _open(self) -> None:
        try:
            await self.coord.start()
        except errors.CoordError as exc:
            raise StartupError(f"cannot open the store: {exc.message}") from exc
        if self.config.restart_grace:
            n = await self.store.restart_grace()
            if n:
                logger.info("restart grace: %d lease(s) run at least one more lease "
                            "period from now", n, extra={"action": "restart_grace", "n": n})

    def _side_tasks(self, tg: asyncio.TaskGroup, server: Listener) -> None:
        tg.create_task(self._reap_loop())
        tg.create_task(self.coord.prune_hub(self.stop_event))
        tg.create_task(self._watch_leadership(server))

    async def _answer_parked(self) -> None:
        self.coord.answer_parked()

    async def _close(self) -> None:
        await self.coord.close()

    async def _reap_loop(self) -> None:
        """Reap every `reaper_interval_s`; a failed round is logged and tried again."""
        while not await self.clock.wait(self.stop_event, self.config.reaper_interval_s):
            try:
                await self.coord.reap()
            except errors.CoordError as exc:
                logger.warning("reap failed: %s: %s", exc.code, exc,
                               extra={"action": "maintenance_failed", "step": "reap"})

    async def _watch_leadership(self, server: Listener) -> None:
        """Exit the process at once when the lock's session is gone (never two serving)."""
        watch = asyncio.ensure_future(self.leader.watch())
        stop = asyncio.ensure_future(self.stop_event.wait())
        await asyncio.wait({watch, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not watch.done():
            watch.cancel()
            return
        reason = watch.result()
        self._close_listeners(server)
        if self._bound is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._bound)
        logger.critical("leadership lost (%s): exiting now so that two coordds never serve "
                        "the same store", reason, extra={"action": "leadership_lost"})
        logging.shutdown()
        sys.stderr.flush()
        os._exit(EXIT_LEADERSHIP_LOST)
