"""The client library: how a program talks to coordd (workers, coordctl, scripts).

`Client` is asyncio (a worker's calls are in coordd.client_leases; the admin, workflow, hub
and push calls in coordd.client_areas); `SyncClient` wraps it for scripts. Both:

- enforce the same explicit frame cap as the daemon (protocol.MAX_FRAME_DEFAULT);
- time out each call (`timeout` seconds, `asyncio.TimeoutError` -> `CallTimeout`);
- reconnect on the next call after a dropped connection (a call in flight when the
  connection drops raises `Disconnected`; it is not resent, because the server may have
  committed it: resend it yourself where it is idempotent — claim with `claim_id`,
  enqueue with `idempotency_key`, `complete` (a resend answers `already_completed`));
- raise the server's error as a `coordd.errors.CoordError` subclass with its `code`.

    async with Client("/run/coordd/coordd.sock") as c:
        job = await c.enqueue(kind="embed", required_role="cpu", priority=0,
                              payload={"texts": ["hello"]})
        view = await c.wait_for(job.job_id, timeout=60)
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from coordd import errors
from coordd.client_areas import AdminCalls, HubCalls, PushCalls, WorkflowCalls
from coordd.client_leases import LeaseCalls
from coordd.client_wire import Deadlines, Wire
from coordd.wire.protocol import (
    MAX_FRAME_DEFAULT, TERMINAL_STATUSES, Enqueue, EnqueueBatchResult, EnqueueResult, JobView,
    ReplyHeader,
)
from coordd.net.frames import encode_frame

if TYPE_CHECKING:
    from coordd.transport import Connector

T = TypeVar("T")
CALL_TIMEOUT_DEFAULT = 30.0

class Disconnected(errors.CoordError):
    """The connection to coordd dropped before the reply came (the call may have committed)."""

    code = "disconnected"


class Refused(Disconnected, errors.PermissionDenied):
    """coordd refused this connection: its certificate or identity (another CA, expired,
    the deny-list). Not an outage: the Connector dials again only after a backoff
    (coordd.transport.Refusals); the message says why."""

    code = "permission_denied"


class Closed(Disconnected):
    """This client closed the connection (its own `close()`) while the call was in flight:
    not an outage of coordd."""


class CallTimeout(errors.CoordError):
    """No reply within the call timeout (the call may still commit)."""

    code = "timeout"


class Unencodable(errors.BadRequest):
    """The request cannot be encoded, so it is not sent: text that is not valid UTF-8 (a
    lone surrogate, e.g. from a non-UTF-8 command-line argument), an integer outside
    -2**63 .. 2**64-1, a value nested too deep, or a type msgpack does not carry."""


def _unencodable(method: str, exc: Exception) -> Unencodable:
    if isinstance(exc, UnicodeEncodeError):
        why = f"text is not valid UTF-8 ({_shown(exc.object[exc.start:exc.end])})"
    elif isinstance(exc, OverflowError):
        why = "an integer is outside -2**63 .. 2**64-1"
    elif isinstance(exc, RecursionError):
        why = "a value is nested too deep"
    else:
        why = " ".join(str(exc).split())
    return Unencodable(f"{method}: the request cannot be sent: {why}")


def _shown(bad: str) -> str:
    """The bytes a lone surrogate stood for (a non-UTF-8 argument), else the characters."""
    try:
        return f"bytes {bad.encode('utf-8', 'surrogateescape')!r}"
    except UnicodeEncodeError:
        return f"characters {bad!r}"


class Client(LeaseCalls, AdminCalls, WorkflowCalls, HubCalls, PushCalls):
    """An asyncio connection to coordd; many calls may be in flight at once.

    Args:
        path: the socket path (default: $COORDD_SOCKET or the per-user default), or
            `tcp://HOST:PORT` (coordd's loopback plaintext test mode).
        timeout: seconds to wait for each reply.
        max_frame: frame cap in bytes for replies.
        connector: how to connect (coordd.transport.Connector: `tls://`, timeouts,
            backoff); default: the Unix socket at `path`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 timeout: float = CALL_TIMEOUT_DEFAULT, max_frame: int = MAX_FRAME_DEFAULT,
                 connector: Connector | None = None) -> None:
        if connector is not None:
            path = connector.endpoint
        if path is None:
            from coordd.paths import default_socket_path
            path = default_socket_path()
        self.path = str(path)
        if connector is None and "://" in self.path:
            from coordd.transport import Connector
            connector = Connector(self.path)
        self.connector = connector
        self.timeout = timeout
        self.max_frame = max_frame
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[ReplyHeader]] = {}
        self._deadlines = Deadlines()  # the calls' timeouts (one loop timer)
        self._wire: Wire | None = None  # the connection (coordd.client_wire)
        self._lock = asyncio.Lock()
        self._refused = False  # coordd refused this connection (Refused)

    async def __aenter__(self) -> "Client":
        await self.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect if not connected.

        Raises:
            Disconnected: nothing listens at the path (coordd is not running).
        """
        async with self._lock:
            if self._wire is not None and not self._wire.closing():
                return
            made = functools.partial(Wire, self)
            if self.connector is not None:
                try:
                    _transport, self._wire = await self.connector.connect(made)
                except errors.CoordError as exc:  # transport.ConnectFailed
                    kind = Refused if getattr(exc, "refused", False) else Disconnected
                    raise kind(exc.message) from exc
                self._refused = False
                return
            try:
                _transport, self._wire = await asyncio.get_running_loop(
                ).create_unix_connection(made, self.path)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                raise Disconnected(f"coordd is not running at {self.path}: {exc.strerror}") from exc
            except OSError as exc:  # permission denied on the socket, path too long, ...
                raise Disconnected(f"cannot connect to coordd at {self.path}: {exc}") from exc

    async def close(self) -> None:
        """Close the connection; calls in flight raise Closed (a Disconnected). Idempotent."""
        wire, self._wire = self._wire, None
        self._fail_pending(Closed("connection closed by this client"))
        self._deadlines.stop()
        if wire is not None:
            if wire.transport.get_write_buffer_size():
                wire.transport.abort()  # unsent requests (their calls failed): no flush to
            else:                       # a peer that may never read them
                wire.transport.close()
            await wire.wait_closed()
        self._fail_pending(Closed("connection closed by this client"))

    def _fail_pending(self, exc: Exception) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)

    @staticmethod
    def disconnected(ended: BaseException | None) -> Disconnected:
        """The error of calls in flight on a connection that ended (`ended`: why, if known)."""
        if ended is None:
            return Disconnected("coordd closed the connection")
        return Disconnected(f"connection to coordd lost: {ended}")

    def _connection_error(self, code: str, message: str) -> errors.CoordError:
        """The error of a connection-level reply; a refusal of this peer starts (or goes
        on with) the connector's refusal backoff."""
        if code != "permission_denied":
            return errors.error_for_code(code, message)
        self._refused = True
        refusals = getattr(self.connector, "refusals", None)
        if refusals is not None:
            refusals.refused(message)
        return Refused(f"coordd refused this connection: {message}")

    async def call(self, method: str, params: Any = None, result_type: type[T] | None = None,
                   timeout: float | None = None,
                   on_sent: Callable[[], None] | None = None) -> T | Any:
        """Send one request and return its decoded result.

        Args:
            method: an RPC method name (protocol.PARAMS).
            params: a params Struct or a dict (None = no params).
            result_type: decode the result into this type (None = plain msgpack objects).
            timeout: seconds to wait for this reply, from the write on (a request that
                waits for a full write buffer counts; default: the client's `timeout`).
            on_sent: called when the request frame is written (after any reconnect): a
                lease holder stamps its send time there.
        Raises:
            errors.CoordError subclass with the server's code; Disconnected; CallTimeout;
            errors.PayloadTooLarge if the request frame is over the cap, Unencodable
            (bad_request) if msgpack cannot carry it (nothing is sent in either case).
        """
        req_id = next(self._ids)
        try:
            frame = encode_frame({"id": req_id, "method": method,
                                  "params": params if params is not None else {}},
                                 self.max_frame, "request")
        except (UnicodeEncodeError, OverflowError, RecursionError, TypeError,
                msgspec.EncodeError) as exc:
            raise _unencodable(method, exc) from exc
        if self._refused:  # this connection was refused: the connector says when to dial
            await self.close()
        wire = self._wire
        if wire is None or wire.closing():
            await self.connect()
            wire = self._wire
        assert wire is not None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ReplyHeader] = loop.create_future()
        self._pending[req_id] = fut
        header: ReplyHeader | None = None  # set once the reply came
        try:
            wire.transport.write(frame)
            if on_sent is not None:
                on_sent()
            # the connection (client_wire.Wire) resolves `fut` as its reply is read; its
            # deadline fails it (no wait_for: its waiter and callback cost a loop turn a
            # reply), also while the request waits for a write buffer the peer does not read
            self._deadlines.add(fut, timeout or self.timeout)
            if wire.paused or wire.lost:
                await wire.drain(fut)
            header = await fut
        except asyncio.TimeoutError:
            raise CallTimeout(f"{method}: no reply within {timeout or self.timeout:g}s") from None
        except (ConnectionError, OSError) as exc:
            self._pending.pop(req_id, None)  # ours is answered by this raise, not by close()
            told = fut.exception() if fut.done() and not fut.cancelled() else None
            lost = told if isinstance(told, errors.CoordError) else Disconnected(
                f"{method}: connection to coordd lost: {exc}")  # the connection knew why first
            self._fail_pending(lost)  # the others too: an outage, not our own close
            await self.close()
            raise lost from exc
        finally:
            self._deadlines.discard(fut)
            self._pending.pop(req_id, None)
            if header is None and fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: an error raised otherwise is never "unretrieved"
        if header.error is not None:
            raise errors.error_for_code(header.error.code, header.error.message)
        if result_type is None:
            return msgspec.msgpack.decode(header.result)
        return msgspec.msgpack.decode(header.result, type=result_type)

    # ------------------------------------------------------------ typed helpers

    async def enqueue(self, **fields: Any) -> EnqueueResult:
        """Enqueue one job (fields of protocol.Enqueue)."""
        return await self.call("enqueue", Enqueue(**fields), EnqueueResult)

    async def enqueue_batch(self, jobs: list[dict[str, Any]]) -> EnqueueBatchResult:
        """Enqueue many jobs in one transaction."""
        return await self.call("enqueue_batch", {"jobs": jobs}, EnqueueBatchResult)

    async def wait_for(self, job_id: str, timeout: float, poll_s: float = 0.2) -> JobView:
        """Wait until the job is terminal; return it. Waits at coordd (`wait_job`); against
        an older coordd (unknown_method) it polls every `poll_s` instead.

        Raises:
            CallTimeout: not terminal within `timeout` seconds (the message names the
                status and, for a waiting job, why it waits).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            try:
                got = await self.wait_job(job_id, max(0.0, left))
            except errors.UnknownMethod:
                break  # an older coordd: poll
            except errors.Overloaded:  # coordd's cap on parked calls: ask again shortly
                if loop.time() >= deadline:
                    raise CallTimeout(f"job {job_id} not terminal after {timeout:g}s") from None
                await asyncio.sleep(poll_s)
                continue
            if got.terminal:
                return got.job
            if loop.time() >= deadline:
                raise CallTimeout(_still(got.job, timeout))
        while True:
            job = await self.get_job(job_id)
            if job.status in TERMINAL_STATUSES:
                return job
            if loop.time() >= deadline:
                raise CallTimeout(_still(job, timeout))
            await asyncio.sleep(poll_s)


def _still(job: JobView, timeout: float) -> str:
    """The message of a wait that timed out: the job's status and, for a waiting job,
    coordd's reason (`job J still waiting after 60s: no live worker runs kind K`)."""
    why = f": {job.waiting_reason}" if job.waiting_reason else ""
    return f"job {job.job_id} still {job.status} after {timeout:g}s{why}"


class SyncClient:
    """A blocking wrapper around Client for scripts: same methods, no `await`.

    Use as a context manager; it runs its own event loop.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, **kw: Any) -> None:
        self._runner = asyncio.Runner()
        self._client = Client(path, **kw)

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection and the loop."""
        try:
            self._runner.run(self._client.close())
        finally:
            self._runner.close()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or not asyncio.iscoroutinefunction(attr):
            return attr

        def blocking(*args: Any, **kw: Any) -> Any:
            return self._runner.run(attr(*args, **kw))
        return blocking
