"""The daemon: socket, services, signals, systemd notifications, orderly shutdown.

Start-up: take `<socket>.lock` (flock) so two starters cannot race; a socket file that
answers means another coordd is live (refuse); one that refuses connections is stale
(unlink it); a non-socket file at the path is never deleted (refuse). Socket activation
through LISTEN_FDS is accepted, and such a socket is never unlinked.
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
import fcntl
import logging
import os
import signal
import socket
import stat
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from coordd import cas, errors, fdlimit, grace, reload
from coordd.clock import Clock, SystemClock
from coordd.config import Config
from coordd.dblock import DbLock, real_db_path
from coordd.listener import Listener
from coordd.reaper import Reaper
from coordd.rpc import Dispatcher, Limits, PeerCred
from coordd.service import Coordinator

logger = logging.getLogger(__name__)

SOCKET_MODE = 0o660
DRAIN_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 2.0
SD_LISTEN_FDS_START = 3


class StartupError(Exception):
    """coordd cannot start (socket in use, bad path, bad database); the message says why."""


def sd_notify(message: str) -> None:
    """Send one datagram to $NOTIFY_SOCKET (no-op when not under systemd)."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path[0] == "@":
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(path)
            s.sendall(message.encode())
    except OSError as exc:
        logger.warning("sd_notify failed: %s", exc)


def activated_socket() -> socket.socket | None:
    """Return the listening socket passed by systemd (LISTEN_FDS), or None; unset the vars."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    n = int(os.environ.get("LISTEN_FDS", "0"))
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    if n < 1:
        return None
    try:
        sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as exc:
        raise StartupError(f"LISTEN_FDS={n} but fd {SD_LISTEN_FDS_START} is not a socket: "
                           f"{exc.strerror or exc}") from exc
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise StartupError(f"the activated socket (fd {SD_LISTEN_FDS_START}) is not a Unix "
                           "stream socket")
    sock.set_inheritable(False)
    return sock


def bind_socket(path: Path) -> tuple[socket.socket, int]:
    """Bind a fresh listening Unix socket at `path` under `<path>.lock`.

    Returns the socket and the lock file descriptor (keep it open while serving).
    Raises:
        StartupError: another coordd answers there, a non-socket file is in the way,
            the folder is missing, or the path is too long for a Unix socket.
    """
    if len(os.fsencode(str(path))) > 107:
        raise StartupError(f"socket path too long for a Unix socket (max 107 bytes): {path}")
    if not path.parent.is_dir():
        raise StartupError(f"socket folder {path.parent} does not exist")
    try:
        lock_fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StartupError(f"cannot create the lock file {path}.lock: "
                           f"{exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StartupError(f"coordd is already running on {path} (lock held)") from None
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode):
                raise StartupError(f"{path} exists and is not a socket; not touching it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(1.0)
            try:
                probe.connect(str(path))
            except (ConnectionRefusedError, FileNotFoundError):
                logger.warning("removing stale socket %s (nothing answers)", path,
                               extra={"action": "stale_socket"})
                os.unlink(path)
            else:
                raise StartupError(f"coordd is already running on {path}")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o117)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, SOCKET_MODE)
        sock.listen(512)
        return sock, lock_fd
    except OSError as exc:
        os.close(lock_fd)
        raise StartupError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    except BaseException:
        os.close(lock_fd)
        raise


class Daemon:
    """coordd: a Coordinator behind the RPC socket, with the reaper beside it.

    Args:
        config: settings; `config.db` and `config.socket` must be set.
        clock: the clock (SystemClock in production).
        config_path: the config file, re-read on SIGHUP (coordd.reload).
    """

    def __init__(self, config: Config, clock: Clock | None = None,
                 config_path: str | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.tcp: Any = None  # coordd.tcp.TcpListener while serving TCP
        self.enrol: Any = None  # and the enrolment listener
        self.clock = clock or SystemClock()
        # the file's real path: SQLite names the -wal/-shm files after it
        self.coord = Coordinator(real_db_path(config.db), config, self.clock)
        self.stop_event = asyncio.Event()
        if config.admin_uids or config.admin_gids:
            self._admin_uids, self._admin_gids = set(config.admin_uids), set(config.admin_gids)
        else:
            self._admin_uids, self._admin_gids = {0, os.getuid()}, set()
        self._db_lock = contextlib.ExitStack()
        self.dispatcher = Dispatcher(self._handle, config.max_frame_bytes, self._is_admin,
                                     limits=Limits(
                                         max_inbound_bytes=config.max_inbound_bytes,
                                         frame_timeout_s=config.frame_timeout_s,
                                         max_unsent_bytes=config.max_unsent_bytes,
                                         max_outbound_bytes=config.max_outbound_bytes,
                                         write_stall_timeout_s=config.write_stall_timeout_s),
                                     clock=self.clock)

    def _is_admin(self, peer: PeerCred) -> bool:
        if peer.uid < 0:  # a TCP peer: only a `coordd-admin://` certificate (coordd.tls)
            return getattr(peer, "admin", None) is not None
        return peer.uid in self._admin_uids or peer.gid in self._admin_gids

    def _handle(self, method: str, params: Any) -> Awaitable[Any]:
        return getattr(self.coord, method)(params)  # the coroutine itself: one frame less

    async def run(self) -> None:
        """Serve until `stop_event` is set (SIGTERM/SIGINT set it), then shut down in order.

        Raises:
            StartupError: the socket or database cannot be used.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        nofile, _hard = fdlimit.raise_nofile_limit()
        sock_path = Path(self.config.socket)
        activated = activated_socket()
        lock_fd = None
        if activated is not None:
            sock = activated
        else:
            sock, lock_fd = bind_socket(sock_path)
        try:
            await self._open_db()
            if self.config.restart_grace:
                await grace.grant_restart_grace(self.coord.writer)
            server = Listener(sock, self.dispatcher.accept)
            server.start()
            self._start_tcp()
            reaper = Reaper(self.coord, self.clock)
            logger.info("coordd serving on %s (db %s; file descriptor limit %d)", sock_path,
                        self.config.db, nofile, extra={"action": "ready", "nofile": nofile})
            sd_notify("READY=1\nSTATUS=serving")
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(reaper.run(self.stop_event))
                    tg.create_task(self._watchdog())
                    tg.create_task(self._metrics_http())
                    tg.create_task(self._watch_writer())
                    tg.create_task(self.dispatcher.run_sweeper(self.stop_event, self.clock))
                    await self.stop_event.wait()
            finally:
                sd_notify("STOPPING=1")
                logger.info("coordd stopping", extra={"action": "stopping"})
                await self._shutdown(server)
        finally:
            await self.coord.close()
            self._db_lock.close()
            if lock_fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISSOCK(os.lstat(sock_path).st_mode):
                        os.unlink(sock_path)
                os.close(lock_fd)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        logger.info("coordd stopped", extra={"action": "stopped"})

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

    def _start_tcp(self) -> None:
        """Serve `listen_tcp` (coordd.tcp) if set."""
        if not self.config.listen_tcp:
            return
        from coordd.tcp import TcpListener
        try:
            self.tcp = TcpListener(self.config, self.dispatcher)
            self.tcp.start()
            if self.config.listen_enroll:
                self.enrol = TcpListener(self.config, self.dispatcher, enrol=True)
                self.enrol.start()
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot listen on TCP: "
                               f"{getattr(exc, 'strerror', None) or exc}") from exc

    def _reload(self) -> None:
        """SIGHUP: what applies while running (coordd.reload); never ends coordd."""
        try:
            reload.reload(self.config, self.config_path, (self.tcp, self.enrol))
        except Exception:  # a signal handler's error would only be logged by the loop
            logger.exception("SIGHUP: reload failed", extra={"action": "reload_failed"})

    async def _watch_writer(self) -> None:
        """End coordd (through the TaskGroup) if the writer task dies: nothing else does."""
        await self.coord.writer.wait_dead(self.stop_event)

    async def _shutdown(self, server: Listener) -> None:
        """Stop intake, finish what is in flight, commit, close the DB, then every peer."""
        server.close()
        for tcp in (self.tcp, self.enrol):
            if tcp is not None:
                tcp.close()
        self.dispatcher.stop_intake()
        await self.coord.push.close()  # every parked call answers now, before the drain
        await self.dispatcher.drain(DRAIN_TIMEOUT_S)
        await self.coord.close()
        await self.dispatcher.close_connections(CLOSE_TIMEOUT_S)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), CLOSE_TIMEOUT_S)
        for tcp in (self.tcp, self.enrol):
            if tcp is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(tcp.wait_closed(), CLOSE_TIMEOUT_S)

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
