"""The coordd error tree. Each class carries its stable wire `code`
(docs/reference/protocol.md, "Error codes").

Only `coordd.net.rpc` maps errors to wire replies; clients rebuild the same classes from
the code with `error_for_code`.
"""

from __future__ import annotations


class CoordError(Exception):
    """Unexpected coordd error."""

    code = "internal"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())

    @property
    def message(self) -> str:
        """The human message (the first argument)."""
        return str(self.args[0]) if self.args else self.code


class BadRequest(CoordError):
    """The request is malformed or a parameter is out of range."""

    code = "bad_request"


class UnknownMethod(CoordError):
    """No such RPC method."""

    code = "unknown_method"


class NotFound(CoordError):
    """No such job or worker."""

    code = "not_found"


class LeaseExpired(CoordError):
    """The lease's expiry time has passed; stop work and do not report a result."""

    code = "lease_expired"


class LeaseLost(CoordError):
    """The lease is not the job's current lease (re-claimed, reaped, cancelled or over max runtime)."""

    code = "lease_lost"


class AlreadyCompleted(CoordError):
    """The job already has a stored result; the first result stands."""

    code = "already_completed"


class InvalidState(CoordError):
    """The job is not in a state that allows this operation."""

    code = "invalid_state"


class GateRefused(CoordError):
    """A resource gate refused the operation."""

    code = "gate_refused"


class PayloadTooLarge(CoordError):
    """A payload, result, error or frame is over its configured size cap."""

    code = "payload_too_large"


class PermissionDenied(CoordError):
    """The peer's uid/gid is not allowed to call this method."""

    code = "permission_denied"


class Overloaded(CoordError):
    """The writer queue is full; retry after a short backoff."""

    code = "overloaded"


class Unavailable(CoordError):
    """Storage refused the write (disk full, I/O error); nothing was stored: retry later.

    Retryable like `overloaded`, but slower to clear: holders of a lease retry their
    complete/fail/renew/checkpoint on it until the lease ends.
    """

    code = "unavailable"


class ConfigError(CoordError):
    """The configuration file is invalid."""

    code = "bad_request"


class StoreError(CoordError):
    """The database could not be opened or is not a coordd database."""

    code = "internal"


def schema_too_new(version: int, known: int) -> StoreError:
    """The refusal of a database a newer coordd has migrated (schema `version` > `known`):
    this coordd would not know its tables, so it neither migrates nor serves it."""
    return StoreError(
        f"database schema v{version} is newer than this coordd (v{known}): a newer coordd "
        "migrated it and coordd does not migrate down; run that version or a newer one")


ERROR_CODES: dict[str, type[CoordError]] = {
    cls.code: cls
    for cls in (
        CoordError, BadRequest, UnknownMethod, NotFound, LeaseExpired, LeaseLost,
        AlreadyCompleted, InvalidState, GateRefused, PayloadTooLarge, PermissionDenied,
        Overloaded, Unavailable,
    )
}


def error_for_code(code: str, message: str) -> CoordError:
    """Return the CoordError subclass instance for a wire `code` (unknown codes -> CoordError)."""
    err = ERROR_CODES.get(code, CoordError)(message)
    if err.code != code:
        err.code = code  # keep codes we don't know (a newer daemon) visible to the caller
    return err


def batch_item(index: int, exc: CoordError) -> CoordError:
    """The same error about job `index` of a batch, its message naming it: `jobs[3]: ...`."""
    err = type(exc)(f"jobs[{index}]: {exc.message}")
    err.code = exc.code
    return err
