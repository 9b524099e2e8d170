"""coordd on a PostgreSQL store (`--store postgresql://...`): the active coordd, or its standby.

Start-up: take the coordinator's session advisory lock (coordd.store.postgres.leader) on a
connection of its own; while another coordd holds it, wait ("standby: waiting for the
active coordd") with no listener open. Once it is ours: open the store, give stored leases
the restart grace, open the socket (and `listen_tcp`), serve StoreCoordinator, reap every
`reaper_interval_s`. The rule not to break: a coordd whose lock session is gone exits at
once (exit code 3), so two coordds never serve the same store.
SIGTERM/SIGINT: the orderly shutdown of coordd.server, then the lock is given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from coordd import errors, fdlimit
from coordd.clock import Clock, SystemClock
from coordd.config import Config
from coordd.listener import Listener
from coordd.rpc import Dispatcher, Limits
from coordd.server import (
    CLOSE_TIMEOUT_S, DRAIN_TIMEOUT_S, Daemon, StartupError, activated_socket, bind_socket,
    sd_notify,
)
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


class StoreDaemon:
    """coordd over a Store chosen by `config.store` (PostgreSQL), with leadership.

    Args:
        config: settings; `config.store` (the DSN) and `config.socket` must be set.
        clock: the clock (SystemClock in production).
        config_path: the config file, re-read on SIGHUP (coordd.reload).
    """

    # the SQLite daemon's own pieces, shared as they are (config, dispatcher, tcp, enrol)
    _is_admin = Daemon._is_admin
    _start_tcp = Daemon._start_tcp
    _reload = Daemon._reload

    def __init__(self, config: Config, clock: Clock | None = None,
                 config_path: str | None = None) -> None:
        try:
            from coordd.store.postgres import PostgresStore
            from coordd.store.postgres.leader import Leadership
        except ImportError as exc:
            raise StartupError(f"the PostgreSQL store needs asyncpg (pip install -e "
                               f"'.[postgres]'): {exc}") from exc
        self.config = config
        self.config_path = config_path
        self.tcp: Any = None
        self.enrol: Any = None
        self.clock = clock or SystemClock()
        self.store = PostgresStore(config.store)
        self.coord = StoreCoordinator(self.store, config, self.clock)
        self.leader = Leadership(config.store, LEADER_KEY, config.store_session_timeout_s)
        self.stop_event = asyncio.Event()
        self._bound: Path | None = None  # the socket file we made (not an activated one)
        if config.admin_uids or config.admin_gids:
            self._admin_uids, self._admin_gids = set(config.admin_uids), set(config.admin_gids)
        else:
            self._admin_uids, self._admin_gids = {0, os.getuid()}, set()
        self.dispatcher = Dispatcher(self.coord.handle, config.max_frame_bytes, self._is_admin,
                                     limits=Limits(
                                         max_inbound_bytes=config.max_inbound_bytes,
                                         frame_timeout_s=config.frame_timeout_s,
                                         max_unsent_bytes=config.max_unsent_bytes,
                                         max_outbound_bytes=config.max_outbound_bytes,
                                         write_stall_timeout_s=config.write_stall_timeout_s),
                                     clock=self.clock)

    async def run(self) -> None:
        """Wait for leadership, then serve until `stop_event` is set; exit the process
        (EXIT_LEADERSHIP_LOST) the moment leadership is lost.

        Raises: StartupError (the store cannot be reached, the socket cannot be used).
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        nofile, _hard = fdlimit.raise_nofile_limit()
        try:
            if not await self._lead():
                logger.info("standby stopped (it never served)", extra={"action": "stopped"})
                return
            await self._serve(nofile)
        finally:
            await self.leader.close()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        logger.info("coordd stopped", extra={"action": "stopped"})

    async def _lead(self) -> bool:
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
            return False
        acquire.result()
        logger.info("standby: the active coordd's session ended; taking over",
                    extra={"action": "takeover"})
        return True

    async def _serve(self, nofile: int) -> None:
        sock_path = Path(self.config.socket)
        activated = activated_socket()
        lock_fd = None
        if activated is not None:
            sock = activated
        else:
            sock, lock_fd = bind_socket(sock_path)
            self._bound = sock_path
        try:
            try:
                await self.coord.start()
            except errors.CoordError as exc:
                raise StartupError(f"cannot open the store: {exc.message}") from exc
            if self.config.restart_grace:
                n = await self.store.restart_grace()
                if n:
                    logger.info("restart grace: %d lease(s) run at least one more lease "
                                "period from now", n, extra={"action": "restart_grace", "n": n})
            server = Listener(sock, self.dispatcher.accept)
            server.start()
            self._start_tcp()
            logger.info("coordd serving on %s (PostgreSQL store; file descriptor limit %d)",
                        sock_path, nofile, extra={"action": "ready", "nofile": nofile})
            sd_notify("READY=1\nSTATUS=serving (active)")
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._reap_loop())
                    tg.create_task(self.coord.prune_hub(self.stop_event))
                    tg.create_task(self._watch_leadership(server))
                    tg.create_task(self.dispatcher.run_sweeper(self.stop_event, self.clock))
                    await self.stop_event.wait()
            finally:
                sd_notify("STOPPING=1")
                logger.info("coordd stopping", extra={"action": "stopping"})
                await self._shutdown(server)
        finally:
            await self.coord.close()
            if lock_fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISSOCK(os.lstat(sock_path).st_mode):
                        os.unlink(sock_path)
                os.close(lock_fd)

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
        server.close()
        for tcp in (self.tcp, self.enrol):
            if tcp is not None:
                tcp.close()
        if self._bound is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._bound)
        logger.critical("leadership lost (%s): exiting now so that two coordds never serve "
                        "the same store", reason, extra={"action": "leadership_lost"})
        logging.shutdown()
        sys.stderr.flush()
        os._exit(EXIT_LEADERSHIP_LOST)

    async def _shutdown(self, server: Listener) -> None:
        """Stop intake, answer parked claims, finish what is in flight, close the store."""
        server.close()
        for tcp in (self.tcp, self.enrol):
            if tcp is not None:
                tcp.close()
        self.dispatcher.stop_intake()
        self.coord.answer_parked()
        await self.dispatcher.drain(DRAIN_TIMEOUT_S)
        await self.coord.close()
        await self.dispatcher.close_connections(CLOSE_TIMEOUT_S)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), CLOSE_TIMEOUT_S)
