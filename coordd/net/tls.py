"""coordd's TCP listener security: the TLS 1.3 server context, who a TLS peer is, and
what it may do.

The rule not to break: a TCP peer acts only as the identity its client certificate names
(URI SAN `coordd-worker://ID` or `coordd-admin://NAME`, from the fleet CA); a certificate
with neither, or one on the deny-list, gets no request served. Refusals (a handshake
OpenSSL refused, with its reason; an identity refused) are logged once per episode of a
peer host and reason (`RefusalLog`): a refused worker that keeps dialling is one line, not
one per try. SIGHUP builds a new context from the files (`TlsServer.reload`): new
handshakes use it, open connections keep theirs.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

from coordd import errors
from coordd.clock import Clock, SystemClock
from coordd.rules.names import check_name
from coordd.net.peercred import PeerCred

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
WORKER_SCHEME = "coordd-worker://"
ADMIN_SCHEME = "coordd-admin://"
REFUSALS: collections.Counter[str] = collections.Counter()
"""Refused handshakes by OpenSSL's reason, since start (the peer is unknown at that point)."""


REFUSAL_QUIET_S = 900.0
"""A refusal episode of (peer host, reason) ends after this long without one (longer than
a refused worker's reconnect backoff cap, coordd.transport.REFUSED_BACKOFF_CAP_S)."""
REFUSAL_KEYS_MAX = 1024
"""Episodes remembered at most (the least recently refused are forgotten first)."""


def refusal_reason(exc: BaseException) -> str:
    """OpenSSL's reason for a refused handshake (`certificate has expired`, ...)."""
    return str(getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or exc)


class LoggingSSLObject(ssl.SSLObject):
    """An SSLObject whose failed handshakes are counted in REFUSALS (by reason; logged by
    TlsServer.handshake_refused, which knows the peer)."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            REFUSALS[refusal_reason(exc)] += 1
            raise


class RefusalLog:
    """Which refusals to log: the first of an episode of (peer host, reason). Repeats are
    counted, not logged, until the pair has been refused nothing for `quiet_s`; the next
    refusal then starts a new episode.

    Args:
        clock: monotonic time (coordd.clock; FakeClock in tests).
        quiet_s: the quiet time that ends an episode.
        max_keys: episodes remembered at most.
    """

    def __init__(self, clock: Clock | None = None, quiet_s: float = REFUSAL_QUIET_S,
                 max_keys: int = REFUSAL_KEYS_MAX) -> None:
        self._mono = (clock or SystemClock()).mono
        self.quiet_s, self._max = quiet_s, max_keys
        self._last: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()
        self.repeats = 0  # refusals not logged (in an episode already logged), since start

    def first(self, host: str, reason: str) -> bool:
        """Count one refusal of `host` for `reason`; True if it starts an episode (log it)."""
        now, key = self._mono(), (host, reason)
        last = self._last.pop(key, None)
        self._last[key] = now
        if len(self._last) > self._max:
            self._last.popitem(last=False)
        if last is not None and now - last < self.quiet_s:
            self.repeats += 1
            return False
        return True

    def note(self, host: str, reason: str, what: str, action: str) -> None:
        """Log `what` (e.g. "refused a TLS handshake") from `host` with `reason`, if it
        starts an episode."""
        if self.first(host, reason):
            logger.warning("%s from %s: %s (its further refusals for this reason are not "
                           "logged until it has been quiet for %s)", what, host, reason,
                           _minutes(self.quiet_s),
                           extra={"action": action, "reason": reason, "peer": host})


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def server_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """A TLS 1.3-only server context that requires a client certificate from `client_ca`
    (None: no client certificate asked, the enrolment listener).

    Raises: OSError / ssl.SSLError (a file is missing or not a certificate / key).
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    if client_ca is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=client_ca)
    ctx.load_cert_chain(cert, key)
    ctx.sslobject_class = LoggingSSLObject
    return ctx


class TlsPeer(PeerCred):
    """A TCP peer: its address and the identity its certificate names (uid/gid -1, so no
    Unix admin rule ever matches it).

    Attributes:
        worker_id: from `coordd-worker://ID`; requests naming another worker id are refused.
        admin: from `coordd-admin://NAME`; admin methods are allowed.
        serial: the certificate's serial (hex, lowercase), "" without a certificate.
        address: "host:port" of the peer.
    """

    def __init__(self, address: str, worker_id: str | None = None, admin: str | None = None,
                 serial: str = "", methods: frozenset[str] | None = None) -> None:
        super().__init__(0, -1, -1)
        self.address, self.worker_id, self.admin, self.serial = address, worker_id, admin, serial
        self.methods = methods

    def __repr__(self) -> str:
        who = (f"worker {self.worker_id}" if self.worker_id else
               f"admin {self.admin}" if self.admin else "no identity")
        return f"{who} at {self.address}"


def _address(transport: Any) -> str:
    return address_of(transport.get_extra_info("peername"))


def address_of(peer: Any) -> str:
    """"host:port" ("[v6]:port") of a socket address (getpeername's tuple)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"[{peer[0]}]:{peer[1]}" if ":" in str(peer[0]) else f"{peer[0]}:{peer[1]}"
    return str(peer)


def _host(address: str) -> str:
    return address.rpartition(":")[0] or address


def identity(cert: dict[str, Any] | None) -> tuple[str | None, str | None, str]:
    """(worker_id, admin name, serial) from `getpeercert()`'s dict (None: no certificate)."""
    if not cert:
        return None, None, ""
    worker = admin = None
    for kind, value in cert.get("subjectAltName", ()):
        if kind != "URI":
            continue
        if value.startswith(WORKER_SCHEME) and worker is None:
            worker = value[len(WORKER_SCHEME):]
        elif value.startswith(ADMIN_SCHEME) and admin is None:
            admin = value[len(ADMIN_SCHEME):]
    return worker or None, admin or None, str(cert.get("serialNumber", "")).lower()


@dataclass
class DenyList:
    """Worker ids and certificate serials (hex, any case) that coordd refuses."""

    workers: set[str] = field(default_factory=set)
    serials: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, workers: list[str], serials: list[str]) -> "DenyList":
        """Build from the config lists (serials normalised: lowercase, no colons/zeros in front)."""
        return cls(set(workers), {_serial(s) for s in serials})

    def why(self, peer: TlsPeer) -> str | None:
        """The reason `peer` is denied, or None."""
        if peer.worker_id is not None and peer.worker_id in self.workers:
            return f"worker id {peer.worker_id} is on the deny-list (tls_deny_workers)"
        if peer.serial and _serial(peer.serial) in self.serials:
            return f"certificate serial {peer.serial} is on the deny-list (tls_deny_serials)"
        return None


def _serial(text: str) -> str:
    return text.replace(":", "").lower().lstrip("0") or "0"


SERIAL_MAX_HEX = 40
"""The longest certificate serial, hex digits less leading zeros (RFC 5280: 20 octets)."""
_HEX = frozenset("0123456789abcdefABCDEF")


def check_deny_lists(workers: list[str], serials: list[str]) -> None:
    """Refuse deny-list entries that could never match: a worker id that is not a valid
    name (coordd.rules.names), a serial that is not hex (colons between digits allowed, any case)
    or is longer than SERIAL_MAX_HEX digits.

    Raises:
        ValueError: naming the setting and the entry.
    """
    for worker in workers:
        try:
            check_name("a worker id", worker)
        except errors.BadRequest as exc:
            raise ValueError(f"tls_deny_workers: {worker!r}: {exc.message}") from exc
    for serial in serials:
        digits = serial.replace(":", "")
        if not digits or not set(digits) <= _HEX or "::" in serial \
                or serial.startswith(":") or serial.endswith(":"):
            raise ValueError(f"tls_deny_serials: {serial!r} is not a certificate serial in "
                             f"hex (e.g. \"1f3a\" or \"1F:3A\", as `coordctl ca issue` prints)")
        if len(digits.lstrip("0")) > SERIAL_MAX_HEX:
            raise ValueError(f"tls_deny_serials: {serial!r} is longer than a certificate "
                             f"serial ({SERIAL_MAX_HEX} hex digits)")


class TlsServer:
    """The TCP listener's TLS state: the current context (None in the loopback plaintext
    test mode), the deny-list, and the peer identification that coordd.net.rpc calls.

    Args:
        files: (cert, key, client_ca) paths, or None for plaintext (tests on loopback).
        deny: refused worker ids and serials.
    """

    def __init__(self, files: tuple[str, str, str | None] | None,
                 deny: DenyList | None = None, open_methods: frozenset[str] | None = None,
                 refusals: RefusalLog | None = None) -> None:
        self.files = files
        self.deny = deny or DenyList()
        self.open_methods = open_methods  # set: no client certificate, only these methods
        self.context: ssl.SSLContext | None = server_context(*files) if files else None
        self.refusals = refusals or RefusalLog()

    def handshake_refused(self, peer: Any, exc: BaseException) -> None:
        """A handshake with `peer` (getpeername's address) failed: log it once per episode
        (coordd.net.listener calls it)."""
        if isinstance(exc, ssl.SSLError):
            self.refusals.note(_host(address_of(peer)), refusal_reason(exc),
                               "refused a TLS handshake", "tls_refused")

    def current(self) -> ssl.SSLContext | None:
        """The context new handshakes use."""
        return self.context

    def reload(self, deny: DenyList | None = None) -> bool:
        """Build a new context from the files (SIGHUP); on failure keep the old one and log
        why. `deny` replaces the deny-list. Returns True if the new context is in use."""
        if deny is not None:
            self.deny = deny
        if self.files is None:
            return False
        try:
            ctx = server_context(*self.files)
        except (OSError, ssl.SSLError, ValueError) as exc:
            logger.error("TLS reload failed, keeping the old certificates: %s", exc,
                         extra={"action": "tls_reload_failed"})
            return False
        self.context = ctx
        logger.info("TLS certificates reloaded from %s", ", ".join(f for f in self.files if f),
                    extra={"action": "tls_reload"})
        return True

    def peer_of(self, transport: Any) -> TlsPeer:
        """Who is on `transport` (coordd.net.rpc calls it when a TCP connection is made).

        Raises: errors.PermissionDenied (no coordd identity in the certificate, or denied).
        """
        address = _address(transport)
        if self.open_methods is not None:  # the enrolment listener: nobody, a few methods
            return TlsPeer(address, methods=self.open_methods)
        ssl_obj = transport.get_extra_info("ssl_object")
        if ssl_obj is None:  # the loopback plaintext test mode: anyone, no admin
            return TlsPeer(address)
        worker, admin, serial = identity(ssl_obj.getpeercert())
        peer = TlsPeer(address, worker, admin, serial)
        why = self.deny.why(peer)
        if worker is None and admin is None:
            why = (f"the certificate names no coordd identity (a URI SAN "
                   f"{WORKER_SCHEME}ID or {ADMIN_SCHEME}NAME)")
        if why is not None:
            self.refusals.note(_host(address), why, "refused a TCP peer", "peer_refused")
            raise errors.PermissionDenied(why)
        return peer

    def denied_now(self, peer: PeerCred) -> str | None:
        """For open connections after a reload: why `peer` is denied now, or None."""
        return self.deny.why(peer) if isinstance(peer, TlsPeer) else None


def split_host_port(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` -> (host, port). Raises: ValueError."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


TCP_USER_TIMEOUT_S = 10.0
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 10, 3, 3


def tune_tcp(sock: socket.socket, user_timeout_s: float = TCP_USER_TIMEOUT_S) -> None:
    """Keepalive and TCP_USER_TIMEOUT on a TCP socket, so a peer behind a partition is
    noticed in about `user_timeout_s` (Linux would otherwise retransmit ~15 min); no
    Nagle delay for small frames. Options the platform lacks are skipped."""
    opts: list[tuple[int, int, int]] = [
        (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
                        ("TCP_USER_TIMEOUT", int(user_timeout_s * 1000))):
        if hasattr(socket, name):
            opts.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in opts:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:
            pass

