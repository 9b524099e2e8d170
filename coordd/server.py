"""The SQLite daemon: a Coordinator behind the socket (coordd.serving: the socket, signals,
the orderly shutdown), with the reaper, the systemd watchdog and metrics over HTTP beside it.

Shutdown on SIGTERM/SIGINT: tell systemd STOPPING=1, stop accepting, answer new requests
`overloaded`, let in-flight requests finish (bounded), drain the writer and commit, close
the database connections and every peer, remove the socket file (not an activated one),
exit 0. With `listen_tcp`, a TCP listener (coordd.tcp, TLS) serves the same dispatcher.
SIGHUP never ends coordd: it reloads what applies (coordd.reload). With `restart_grace`,
stored leases get one more lease period before the reaper's first round (coordd.grace).

Admin methods (protocol.ADMIN_METHODS): when both `admin_uids` and `admin_gids` are
empty (the default), root and coordd's own uid are admins; once either list is set,
exactly the listed uids/gids are, and nobody else (not even root or coordd's own uid).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from coordd import cas, errors, fdlimit, grace
from coordd.clock import Clock
from coordd.config import Config
from coordd.dblock import DbLock, real_db_path
from coordd.listener import Listener
from coordd.reaper import Reaper
from coordd.service import Coordinator
from coordd.serving import (  # noqa: F401 - re-exported for the callers of coordd.server
    CLOSE_TIMEOUT_S, DRAIN_TIMEOUT_S, SOCKET_MODE, ServingDaemon, StartupError,
    activated_socket, bind_socket, lock_socket, sd_notify,
)

logger = logging.getLogger(__name__)


class Daemon(ServingDaemon):
    """coordd: a Coordinator on SQLite behind the RPC socket, with the reaper beside it.

    Args:
        config: settings; `config.db` and `config.socket` must be set.
        clock: the clock (SystemClock in production).
        config_path: the config file, re-read on SIGHUP (coordd.reload).
    """

    def __init__(self, config: Config, clock: Clock | None = None,
                 config_path: str | None = None) -> None:
        super().__init__(config, clock, config_path)
        # the file's real path: SQLite names the -wal/-shm files after it
        self.coord = Coordinator(real_db_path(config.db), config, self.clock)
        self._db_lock = contextlib.ExitStack()

    def _handle(self, method: str, params: Any) -> Awaitable[Any]:
        return getattr(self.coord, method)(params)  # the coroutine itself: one frame less

    def _ready_note(self) -> str:
        return f"db {self.config.db}"

    async def _open(self) -> None:
        await self._open_db()
        if self.config.restart_grace:
            await grace.grant_restart_grace(self.coord.writer)

    def _side_tasks(self, tg: asyncio.TaskGroup, server: Listener) -> None:
        tg.create_task(Reaper(self.coord, self.clock).run(self.stop_event))
        tg.create_task(self._watchdog())
        tg.create_task(self._metrics_http())
        tg.create_task(self._watch_writer())

    async def _answer_parked(self) -> None:
        await self.coord.push.close()  # every parked call answers now, before the drain

    async def _close(self) -> None:
        await self.coord.close()
        self._db_lock.close()

    async def _open_db(self) -> None:
        db = Path(self.config.db)
        if not db.parent.is_dir():
            raise StartupError(f"database folder {db.parent} does not exist")
        if db.exists() and not db.is_file():
            raise StartupError(f"database {db} is not a regular file")
        try:  # held while coordd runs (on the file, by any name), so no second coordd
            lock = self._db_lock.enter_context(DbLock(db))  # nor a restore swaps it
        except errors.InvalidState as exc:
            raise StartupError(exc.message) from exc
        except OSError as exc:
            raise StartupError(f"cannot open the database {db}: cannot create its lock file "
                               f"({(exc.strerror or str(exc)).lower()})") from exc
        try:
            await self.coord.start()
        except errors.StoreError as exc:
            raise StartupError(f"cannot open the database: {exc.message}") from exc
        try:
            lock.lock_inode()  # a file SQLite just created
        except errors.InvalidState as exc:
            raise StartupError(exc.message) from exc
        with contextlib.suppress(OSError):  # workers (group coordd) write into it too
            cas.make_dir(self.coord.artifact_dir)  # setgid, group-writable (cas.STORE_DIR_MODE)

    async def _watch_writer(self) -> None:
        """End coordd (through the TaskGroup) if the writer task dies: nothing else does."""
        await self.coord.writer.wait_dead(self.stop_event)

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
            try:  # ping only when the writer commits: a wedged writer gets restarted
                await asyncio.wait_for(self.coord.ping(), interval)
            except (asyncio.TimeoutError, errors.CoordError):
                continue
            sd_notify("WATCHDOG=1")
