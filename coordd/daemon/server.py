"""The daemon: a Coordinator behind the socket (coordd.daemon.serving: the socket, signals, the
orderly shutdown), over the store the config names: SQLite (`--db PATH`) or PostgreSQL
(`--store postgresql://...`). The same class serves both; what differs is the store.

Start-up: take the socket path's lock (a second coordd on the same socket is refused at
once, never left to find the path taken at fail-over), then the store's leadership
(`Store.leader`: SQLite's is always won, the file's lock keeps a second coordd off it;
PostgreSQL's is a session advisory lock: while another coordd holds it, wait as a
standby with no listener open). Once it is ours: open the socket (and `listen_tcp`), open
the store, give stored leases the restart grace, serve, and run the maintenance round
(coordd.service.reaper), the systemd watchdog and metrics over HTTP beside it. The rule not to
break: a coordd whose leadership is gone exits at once (exit code 3), so two coordds
never serve the same store.

Shutdown on SIGTERM/SIGINT: tell systemd STOPPING=1, stop accepting, answer new requests
`overloaded`, let in-flight requests finish (bounded), drain the store's writes, close
it and every peer, remove the socket file (not an activated one), exit 0. SIGHUP never
ends coordd: it reloads what applies (coordd.daemon.reload).

Admin methods (protocol.ADMIN_METHODS): when both `admin_uids` and `admin_gids` are
empty (the default), root and coordd's own uid are admins; once either list is set,
exactly the listed uids/gids are, and nobody else (not even root or coordd's own uid).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from coordd import errors
from coordd.net import fdlimit
from coordd.clock import Clock, anchored
from coordd.config import Config
from coordd.store.sqlite.dblock import real_db_path
from coordd.net.listener import Listener
from coordd.service.reaper import Reaper
from coordd.service import Coordinator
from coordd.daemon.serving import (  # noqa: F401 - re-exported for coordd.daemon.server's callers
    CLOSE_TIMEOUT_S, DRAIN_TIMEOUT_S, SOCKET_MODE, ServingDaemon, StartupError,
    activated_socket, bind_socket, lock_socket, sd_notify,
)
from coordd.store.dsn import store_address

logger = logging.getLogger(__name__)

EXIT_LEADERSHIP_LOST = 3
LEADER_KEY = "coordd"


def open_store(config: Config, clock: Clock) -> Any:
    """The store `config` names, not yet started: a PostgresStore for `config.store`,
    else a SQLiteStore on `config.db` (by its real path: SQLite names the -wal and -shm
    files after it). Raises: StartupError (PostgreSQL without asyncpg installed)."""
    if config.store:
        try:
            from coordd.store.postgres import PostgresStore
            from coordd.store.postgres.leader import pool_settings
        except ImportError as exc:
            raise StartupError(f"the PostgreSQL store needs asyncpg (pip install -e "
                               f"'.[postgres]'): {exc}") from exc
        return PostgresStore(config.store, aging_s=config.aging_interval_s,
                             server_settings=pool_settings(config.store_session_timeout_s))
    from coordd.store.sqlite.store import SQLiteStore
    return SQLiteStore.from_config(real_db_path(config.db), config, clock)


def sqlite_coordinator(path: str, config: Config, clock: Clock,
                       rng: random.Random | None = None) -> Coordinator:
    """A Coordinator over a SQLiteStore on `path` sized by `config`, not started: what
    `coordd --db PATH` builds, for tests, benches and docgen. `rng`: backoff jitter."""
    from coordd.store.sqlite.store import SQLiteStore
    clock = anchored(clock)  # the store's writer and the coordinator share it
    return Coordinator(SQLiteStore.from_config(path, config, clock), config, clock, rng)


class Daemon(ServingDaemon):
    """coordd: a Coordinator over the configured store behind the RPC socket.

    Args:
        config: settings; `config.socket`, and `config.db` or `config.store`, must be set.
        clock: the clock (SystemClock in production).
        config_path: the config file, re-read on SIGHUP (coordd.daemon.reload).
    """

    def __init__(self, config: Config, clock: Clock | None = None,
                 config_path: str | None = None) -> None:
        super().__init__(config, clock, config_path)
        clock = anchored(self.clock)  # the store's writer and the coordinator share it
        self.coord = Coordinator(open_store(config, clock), config, clock,
                                 peers=self.dispatcher.peers)
        self.dispatcher.at_once["heartbeat"] = self.coord.beats.quiet_reply  # no task
        self.leader = self.coord.store.leader(LEADER_KEY, config.store_session_timeout_s)
        self._held = contextlib.ExitStack()
        if config.store:
            self.serving_status = "serving (active)"

    def _handle(self, method: str, params: Any) -> Awaitable[Any]:
        return getattr(self.coord, method)(params)  # type: ignore[no-any-return]

    def _ready_note(self) -> str:
        return f"db {self.config.db}" if not self.config.store else "PostgreSQL store"

    def _lock_socket(self, path: Path) -> int:
        try:
            return lock_socket(path)
        except StartupError as exc:
            if not self.config.store or "lock held" not in str(exc):
                raise
            raise StartupError(f"socket {path} is in use by a running coordd (the active "
                               "one?): a standby on the same host needs a --socket of its "
                               "own") from None

    async def run(self) -> None:
        """Wait for leadership, then serve until `stop_event` is set; exit the process
        (EXIT_LEADERSHIP_LOST) the moment leadership is lost.

        Raises: StartupError (the store cannot be opened or reached, the socket cannot
        be used).
        """
        try:
            await super().run()
        finally:
            await self.leader.close()

    async def _before_listen(self) -> bool:
        """Hold the store's leadership; False if stopped while waiting for it."""
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
        store = self.coord.store
        try:  # held while coordd runs (SQLite: the file's lock, by any of its names)
            self._held.enter_context(store.hold(self.config.db))
            await self.coord.start()
        except errors.InvalidState as exc:
            raise StartupError(exc.message) from exc
        except errors.CoordError as exc:
            raise StartupError(f"cannot open {store.noun}: {exc.message}") from exc
        await self.coord.beats.restarted()  # quiet beats a stopped coordd had not stored
        if self.config.restart_grace:
            n = await store.restart_grace()
            if n:
                logger.info("restart grace: %d lease(s) run at least one more lease "
                            "period from now", n, extra={"action": "restart_grace", "n": n})

    def _side_tasks(self, tg: asyncio.TaskGroup, server: Listener) -> None:
        tg.create_task(Reaper(self.coord, self.clock).run(self.stop_event))
        tg.create_task(self._watchdog())
        tg.create_task(self._metrics_http())
        tg.create_task(self._watch_store())
        tg.create_task(self._watch_leadership(server))

    async def _answer_parked(self) -> None:
        await self.coord.push.close()  # every parked call answers now, before the drain

    async def _close(self) -> None:
        try:
            await self.coord.close()
        finally:
            self._held.close()

    async def _watch_store(self) -> None:
        """End coordd (through the TaskGroup) if the store's writer task dies."""
        await self.coord.store.wait_dead(self.stop_event)

    async def _watch_leadership(self, server: Listener) -> None:
        """Exit the process at once when the leadership is gone (never two serving)."""
        watch = asyncio.ensure_future(self.leader.watch())
        stop = asyncio.ensure_future(self.stop_event.wait())
        await asyncio.wait({watch, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not watch.done():
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
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

    async def _metrics_http(self) -> None:
        """Serve Prometheus metrics on 127.0.0.1:`metrics_port` (if set) until stop,
        refreshing the gauges every reaper interval. A port in use is logged, not fatal."""
        port = self.config.metrics_port
        if not port:
            return
        try:
            httpd, thread = start_http_server(port, addr="127.0.0.1",
                                              registry=self.coord.meters.registry)
        except OSError as exc:
            logger.error("metrics over HTTP are off: 127.0.0.1:%d: %s", port, exc,
                         extra={"action": "metrics_http_failed"})
            return
        logger.info("metrics on http://127.0.0.1:%d/metrics", port, extra={"action": "metrics"})
        try:
            while True:
                try:
                    await self.coord.metrics()  # refreshes the gauges
                except (errors.CoordError, OSError) as exc:  # e.g. EMFILE: next round
                    if not fdlimit.note_exhaustion(exc, "metrics refresh"):
                        logger.warning("metrics refresh failed: %s", exc)
                if await self.clock.wait(self.stop_event, self.config.reaper_interval_s):
                    return
        finally:
            await asyncio.to_thread(httpd.shutdown)
            httpd.server_close()
            await asyncio.to_thread(thread.join, 5.0)

    async def _watchdog(self) -> None:
        """Under systemd's watchdog ($WATCHDOG_USEC for this $WATCHDOG_PID), send WATCHDOG=1
        every half interval while the writer commits (a wedged one gets coordd restarted)."""
        usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
        if usec <= 0 or os.environ.get("WATCHDOG_PID", str(os.getpid())) != str(os.getpid()):
            return
        interval = usec / 2e6
        while not await self.clock.wait(self.stop_event, interval):
            try:  # ping only when the store commits: a wedged writer gets restarted
                await asyncio.wait_for(self.coord.ping(), interval)
            except (asyncio.TimeoutError, errors.CoordError):
                continue
            sd_notify("WATCHDOG=1")
