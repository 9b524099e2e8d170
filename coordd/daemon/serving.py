"""The socket and the serve/shutdown skeleton of the daemon (coordd.daemon.server, over either
store).

Start-up: take `<socket>.lock` (flock) first, so two starters cannot race and a standby
keeps the path for itself; a socket file that answers means another coordd is live
(refuse); one that refuses connections is stale (unlink it); a non-socket file at the
path is never deleted (refuse). Socket activation through LISTEN_FDS is accepted, and
such a socket is never unlinked. Shutdown: stop accepting, answer new requests
`overloaded`, answer parked calls, let in-flight requests finish (bounded), close the
store, then every peer, remove the socket file we made.
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

from coordd.net import fdlimit
from coordd.daemon import reload
from coordd.clock import Clock, SystemClock
from coordd.config import Config
from coordd.net.listener import Listener
from coordd.net.rpc import Dispatcher, Limits, PeerCred

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


def lock_socket(path: Path) -> int:
    """Take `<path>.lock` (flock, non-blocking): one coordd per socket path on a host.

    Returns the lock file descriptor (keep it open while the path is ours).
    Raises:
        StartupError: another process holds the lock, the folder is missing, the path is
            too long for a Unix socket, or the lock file cannot be made.
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
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise StartupError(f"coordd is already running on {path} (lock held)") from None
    return lock_fd


def bind_socket(path: Path, lock_fd: int | None = None) -> tuple[socket.socket, int]:
    """Bind a fresh listening Unix socket at `path` under `<path>.lock` (`lock_fd`: the
    lock already taken by `lock_socket`; None: take it now).

    Returns the socket and the lock file descriptor (keep it open while serving).
    Raises:
        StartupError: another coordd answers there, a non-socket file is in the way,
            the folder is missing, or the path is too long for a Unix socket.
    """
    if lock_fd is None:
        lock_fd = lock_socket(path)
    try:
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


class ServingDaemon:
    """What both daemons share: the RPC dispatcher, the socket (its lock taken first), the
    TCP listeners, SIGHUP, serving until `stop_event`, the orderly shutdown.

    Subclasses say how the store opens (`_open`), what runs beside the listeners
    (`_side_tasks`), how parked calls are answered at shutdown (`_answer_parked`), and may
    wait before listening (`_before_listen`: the standby).

    Args:
        config: settings; `config.socket` must be set.
        clock: the clock (SystemClock in production).
        config_path: the config file, re-read on SIGHUP (coordd.daemon.reload).
    """

    serving_status = "serving"  # systemd's STATUS= once listening

    def __init__(self, config: Config, clock: Clock | None = None,
                 config_path: str | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.tcp: Any = None  # coordd.daemon.tcp.TcpListener while serving TCP
        self.enrol: Any = None  # and the enrolment listener
        self.clock = clock or SystemClock()
        self.stop_event = asyncio.Event()
        self._bound: Path | None = None  # the socket file we made (not an activated one)
        if config.admin_uids or config.admin_gids:
            self._admin_uids, self._admin_gids = set(config.admin_uids), set(config.admin_gids)
        else:
            self._admin_uids, self._admin_gids = {0, os.getuid()}, set()
        self.dispatcher = Dispatcher(self._handle, config.max_frame_bytes, self._is_admin,
                                     limits=Limits(
                                         max_inbound_bytes=config.max_inbound_bytes,
                                         frame_timeout_s=config.frame_timeout_s,
                                         max_unsent_bytes=config.max_unsent_bytes,
                                         max_outbound_bytes=config.max_outbound_bytes,
                                         write_stall_timeout_s=config.write_stall_timeout_s),
                                     clock=self.clock)

    def _handle(self, method: str, params: Any) -> Awaitable[Any]:
        raise NotImplementedError

    def _is_admin(self, peer: PeerCred) -> bool:
        if peer.uid < 0:  # a TCP peer: only a `coordd-admin://` certificate (coordd.net.tls)
            return getattr(peer, "admin", None) is not None
        return peer.uid in self._admin_uids or peer.gid in self._admin_gids

    async def _before_listen(self) -> bool:
        """Wait until this coordd may listen; False: stop without serving."""
        return True

    async def _open(self) -> None:
        """Open the store (StartupError if it cannot be used)."""
        raise NotImplementedError

    def _side_tasks(self, tg: asyncio.TaskGroup, server: Listener) -> None:
        """Start what runs beside the listeners (a task ending in error ends coordd)."""

    async def _answer_parked(self) -> None:
        """Answer every parked call (shutdown, before the drain)."""

    async def _close(self) -> None:
        """Close the store (idempotent)."""

    def _ready_note(self) -> str:
        return ""

    def _lock_socket(self, path: Path) -> int:
        return lock_socket(path)

    async def run(self) -> None:
        """Serve until `stop_event` is set (SIGTERM/SIGINT set it), then shut down in order.

        Raises:
            StartupError: the socket or the store cannot be used.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        nofile, _hard = fdlimit.raise_nofile_limit()
        sock_path = Path(self.config.socket)
        lock_fd = None
        try:
            activated = activated_socket()
            if activated is None:  # the path is ours before anything else (a standby too)
                lock_fd = self._lock_socket(sock_path)
            if not await self._before_listen():
                return
            if activated is None:
                fd, lock_fd = lock_fd, None  # bind_socket closes it if it fails
                sock, lock_fd = bind_socket(sock_path, fd)
                self._bound = sock_path
            else:
                sock = activated
            await self._serve(sock, sock_path, nofile)
        finally:
            await self._close()
            if lock_fd is not None:
                if self._bound is not None:
                    with contextlib.suppress(FileNotFoundError):
                        if stat.S_ISSOCK(os.lstat(sock_path).st_mode):
                            os.unlink(sock_path)
                os.close(lock_fd)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        if self._bound is not None or activated is not None:
            logger.info("coordd stopped", extra={"action": "stopped"})

    async def _serve(self, sock: socket.socket, sock_path: Path, nofile: int) -> None:
        await self._open()
        server = Listener(sock, self.dispatcher.accept)
        server.start()
        self._start_tcp()
        logger.info("coordd serving on %s (%s; file descriptor limit %d)", sock_path,
                    self._ready_note(), nofile, extra={"action": "ready", "nofile": nofile})
        sd_notify(f"READY=1\nSTATUS={self.serving_status}")
        try:
            async with asyncio.TaskGroup() as tg:
                self._side_tasks(tg, server)
                tg.create_task(self.dispatcher.run_sweeper(self.stop_event, self.clock))
                await self.stop_event.wait()
        finally:
            sd_notify("STOPPING=1")
            logger.info("coordd stopping", extra={"action": "stopping"})
            await self._shutdown(server)

    def _start_tcp(self) -> None:
        """Serve `listen_tcp` (coordd.daemon.tcp) if set."""
        if not self.config.listen_tcp:
            return
        from coordd.daemon.tcp import TcpListener
        try:
            self.tcp = TcpListener(self.config, self.dispatcher)
            self.tcp.start()
            if self.config.listen_enroll:
                self.enrol = TcpListener(self.config, self.dispatcher, enrol=True)
                self.enrol.start()
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot listen on TCP: "
                               f"{getattr(exc, 'strerror', None) or exc}") from exc

    def _tcp_listeners(self) -> list[Any]:
        return [t for t in (self.tcp, self.enrol) if t is not None]

    def _close_listeners(self, server: Listener) -> None:
        """Stop accepting on the socket and on TCP."""
        server.close()
        for tcp in self._tcp_listeners():
            tcp.close()

    def _reload(self) -> None:
        """SIGHUP: what applies while running (coordd.daemon.reload); never ends coordd."""
        try:
            reload.reload(self.config, self.config_path, (self.tcp, self.enrol))
        except Exception:  # a signal handler's error would only be logged by the loop
            logger.exception("SIGHUP: reload failed", extra={"action": "reload_failed"})

    async def _shutdown(self, server: Listener) -> None:
        """Stop intake, answer parked calls, finish what is in flight, close the store,
        then every peer."""
        self._close_listeners(server)
        self.dispatcher.stop_intake()
        await self._answer_parked()
        await self.dispatcher.drain(DRAIN_TIMEOUT_S)
        await self._close()
        await self.dispatcher.close_connections(CLOSE_TIMEOUT_S)
        for closing in (server, *self._tcp_listeners()):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(closing.wait_closed(), CLOSE_TIMEOUT_S)
