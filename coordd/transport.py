"""How a client reaches coordd: a Unix socket path, or `tls://HOST:PORT` with mutual TLS
(`tcp://HOST:PORT` only for coordd's loopback plaintext test mode).

The rules not to break: the server name is pinned (`coordd`, pki.SERVER_NAME) whatever
address is dialled; every connect has a timeout; after a failed connect the next one waits
a capped exponential backoff with full jitter (`uniform(0, min(cap, base * 2**n))`), so a
fleet that lost coordd does not reconnect in lockstep; TCP sockets get keepalive and
TCP_USER_TIMEOUT (coordd.net.tls.tune_tcp), so a partition is noticed in seconds. A refusal
by coordd (its certificate, identity or deny-list: coordd.net.tls) is no outage: the next dial
waits a backoff that doubles per refusal in a row up to REFUSED_BACKOFF_CAP_S
(`Refusals`, shared by a program's connectors), and calls in between fail at once with
the reason, without dialling.
"""

from __future__ import annotations

import asyncio
import math
import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from coordd import errors
from coordd.net import tls
from coordd.clock import Clock, SystemClock

SERVER_NAME = "coordd"
CONNECT_TIMEOUT_S = 5.0
BACKOFF_BASE_S = 0.2
BACKOFF_CAP_S = 5.0
READ_LIMIT = 1 << 20
REFUSED_BACKOFF_BASE_S = 1.0
REFUSED_BACKOFF_CAP_S = 300.0

P = TypeVar("P", bound=asyncio.BaseProtocol)


class ConnectFailed(errors.CoordError):
    """coordd could not be reached (the code is the client's `disconnected`); `refused`:
    not dialled, coordd refused this client a moment ago (Refusals)."""

    code = "disconnected"

    def __init__(self, message: str | None = None, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class Refusals:
    """coordd refused this client: when it may dial again. After the n-th refusal in a
    row the next dial waits between half and all of min(cap_s, base_s * 2**(n-1)); a
    reply that is no refusal ends the episode. One instance may serve several Connectors
    (a worker's connections), so they back off together.

    Args:
        base_s / cap_s: the backoff's first step and cap (seconds).
        rng / clock: injectable for tests (coordd.clock.FakeClock).
    """

    def __init__(self, base_s: float = REFUSED_BACKOFF_BASE_S,
                 cap_s: float = REFUSED_BACKOFF_CAP_S, rng: random.Random | None = None,
                 clock: Clock | None = None) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self._rng = rng or random.Random()
        self._clock = clock or SystemClock()
        self.count = 0          # refusals in a row
        self.reason = ""        # the last one's
        self._next_try = 0.0    # monotonic: no dial before this

    def _step(self) -> float:
        return min(self.cap_s, self.base_s * 2.0 ** min(max(self.count - 1, 0), 30))

    def refused(self, reason: str) -> float:
        """Count a refusal; return the seconds until the next dial."""
        self.count += 1
        self.reason = reason
        step = self._step()
        wait = self._rng.uniform(step / 2, step)
        self._next_try = self._clock.mono() + wait
        return wait

    def answered(self) -> None:
        """coordd served a request: the episode is over."""
        self.count, self.reason, self._next_try = 0, "", 0.0

    def admit(self) -> str | None:
        """None: dial now (in an episode, the others wait for this one's outcome for half
        a step); else why not, with the seconds left."""
        if not self.count:
            return None
        now = self._clock.mono()
        left = self._next_try - now
        if left > 0:
            return f"coordd refused this connection: {self.reason}; next try in {math.ceil(left)} s"
        self._next_try = now + self._step() / 2
        return None


@dataclass(frozen=True)
class TlsFiles:
    """The worker's certificate and key, and the fleet CA that coordd's certificate chains to."""

    cert: str
    key: str
    ca: str


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """A TLS 1.3 client context: coordd's certificate must chain to `files.ca` and name
    SERVER_NAME; ours is presented. Raises: OSError / ssl.SSLError (bad files)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(files.cert, files.key)
    return ctx


class Connector:
    """Open connections to one coordd endpoint.

    Args:
        endpoint: a Unix socket path, `tls://HOST:PORT` or `tcp://HOST:PORT`.
        files: the TLS files (required for tls://).
        connect_timeout_s: one connect (TCP + TLS handshake) must finish within this.
        backoff_base_s / backoff_cap_s: the full-jitter backoff between failed connects.
        rng / clock: injectable for tests.
        context: an SSLContext to use instead of one made from `files` (enrolment).
        refusals: the refusal backoff (shared by a program's connectors; default its own).
    Raises: ValueError (a bad endpoint, or tls:// without files).
    """

    def __init__(self, endpoint: str, files: TlsFiles | None = None, *,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 backoff_base_s: float = BACKOFF_BASE_S, backoff_cap_s: float = BACKOFF_CAP_S,
                 user_timeout_s: float = tls.TCP_USER_TIMEOUT_S,
                 rng: random.Random | None = None, clock: Clock | None = None,
                 server_name: str = SERVER_NAME, context: ssl.SSLContext | None = None,
                 refusals: Refusals | None = None) -> None:
        self.endpoint = endpoint
        self.scheme, _, rest = endpoint.partition("://") if "://" in endpoint else ("unix", "", endpoint)
        if self.scheme not in ("unix", "tls", "tcp"):
            raise ValueError(f"{endpoint!r}: use a socket path, tls://HOST:PORT or tcp://HOST:PORT")
        self.path = rest if self.scheme == "unix" else ""
        self.host, self.port = ("", 0) if self.scheme == "unix" else tls.split_host_port(rest)
        if self.scheme == "tls" and files is None and context is None:
            raise ValueError(f"{endpoint}: tls:// needs a certificate, key and CA (--cert, --key, --ca)")
        self._ctx = context or (client_context(files) if self.scheme == "tls" and files else None)
        self.connect_timeout_s = connect_timeout_s
        self._base, self._cap = backoff_base_s, backoff_cap_s
        self._user_timeout_s = user_timeout_s
        self._rng = rng or random.Random()
        self._clock = clock or SystemClock()
        self._server_name = server_name
        self._files = files
        self.refusals = refusals or Refusals(clock=self._clock)
        self.failures = 0
        self._next_try = 0.0  # monotonic: no connect before this (backoff)
        self.opened_at = 0.0  # monotonic: the last connect that succeeded

    def backoff_s(self) -> float:
        """The wait before the next connect after `failures` failed ones (full jitter)."""
        if not self.failures:
            return 0.0
        return self._rng.uniform(0.0, min(self._cap, self._base * 2.0 ** min(self.failures - 1, 30)))

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect as `connect` does, as a pair of streams.

        Raises: ConnectFailed (see `connect`).
        """
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=READ_LIMIT, loop=loop)
        transport, protocol = await self.connect(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop))
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def connect(self, protocol_factory: Callable[[], P]) -> tuple[asyncio.Transport, P]:
        """Connect (after the backoff's wait, if the last connect failed), served by the
        protocol `protocol_factory()` makes.

        Raises: ConnectFailed (nothing answers, timeout, a refused handshake: with a hint;
        `refused`: coordd refused this client a moment ago, not dialled: Refusals).
        """
        not_yet = self.refusals.admit()
        if not_yet is not None:
            raise ConnectFailed(not_yet, refused=True)
        wait = self._next_try - self._clock.mono()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            pair = await asyncio.wait_for(self._open(protocol_factory), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
            self.failures += 1
            self._next_try = self._clock.mono() + self.backoff_s()
            raise ConnectFailed(self._why(exc)) from exc
        self.failures = 0
        self._next_try = 0.0
        self.opened_at = self._clock.mono()
        return pair

    async def _open(self, protocol_factory: Callable[[], P]) -> tuple[asyncio.Transport, P]:
        loop = asyncio.get_running_loop()
        if self.scheme == "unix":
            return await loop.create_unix_connection(protocol_factory, self.path)
        transport, protocol = await loop.create_connection(
            protocol_factory, self.host, self.port, ssl=self._ctx,
            server_hostname=self._server_name if self._ctx else None,
            ssl_handshake_timeout=self.connect_timeout_s if self._ctx else None)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tls.tune_tcp(sock, self._user_timeout_s)  # type: ignore[arg-type]
        return transport, protocol  # type: ignore[return-value]

    def _why(self, exc: BaseException) -> str:
        where = self.path if self.scheme == "unix" else f"{self.scheme}://{self.host}:{self.port}"
        if isinstance(exc, asyncio.TimeoutError):
            return f"cannot connect to coordd at {where}: no answer within {self.connect_timeout_s:g}s"
        if isinstance(exc, ssl.SSLCertVerificationError):
            return (f"cannot connect to coordd at {where}: its certificate does not verify "
                    f"against the fleet CA or name {self._server_name!r}: {exc.verify_message}")
        if isinstance(exc, (FileNotFoundError, ConnectionRefusedError)) and self.scheme == "unix":
            return f"coordd is not running at {where}: {exc.strerror}"
        text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return f"cannot connect to coordd at {where}: {text}"

    def closed_unanswered(self, exc: BaseException | None) -> str | None:
        """Why coordd closed a TLS connection without a reply, if that was a refusal of this
        certificate (coordd.net.tls logs why): the connection ended by EOF, a reset or a TLS
        alert within `connect_timeout_s` of its connect (a partition ends by a timeout, much
        later). What this host can see of the cause (coordd.net.pki.leaf_problem) is named.
        None: not a refusal."""
        quick = self._clock.mono() - self.opened_at <= self.connect_timeout_s
        if self.scheme != "tls" or not quick or not (exc is None or isinstance(
                exc, (ConnectionResetError, ssl.SSLError, asyncio.IncompleteReadError))):
            return None
        problem = None
        if self._files is not None:
            from coordd.net import pki
            try:
                with open(self._files.cert, "rb") as c, open(self._files.ca, "rb") as a:
                    problem = pki.leaf_problem(c.read(), a.read(), self._clock.wall())
            except OSError:
                pass
        cert = self._files.cert if self._files else "this client's certificate"
        return (f"coordd at {self.scheme}://{self.host}:{self.port} refused the certificate "
                f"{cert}: " + (problem or "coordd's log says why (\"refused a TLS handshake\")"))
