"""What a page or an action answers when coordd does not: one HTTP status per coordd
error, so a stuck, overloaded or refusing coordd gives a clear page, never a 500.
"""

from __future__ import annotations

from coordd import errors
from coordd.client import CallTimeout, Disconnected

STATUS_BY_CODE = {
    "not_found": 404, "bad_request": 400, "permission_denied": 403,
    "overloaded": 503, "unavailable": 503, "disconnected": 503, "timeout": 504,
}
OTHER_STATUS = 502  # any other coordd error: coordd answered, but not with a page


def status_of(exc: errors.CoordError) -> int:
    """The HTTP status for a coordd error (by its wire code; unknown codes: 502)."""
    return STATUS_BY_CODE.get(exc.code, OTHER_STATUS)


def words_of(exc: errors.CoordError) -> str:
    """A one-line reason for an error page."""
    if isinstance(exc, Disconnected):
        return f"coordd is not reachable: {exc}"
    if isinstance(exc, CallTimeout):
        return f"coordd did not answer in time: {exc}"
    if exc.code in ("overloaded", "unavailable"):
        return f"coordd is {'overloaded' if exc.code == 'overloaded' else 'unavailable'}: {exc}"
    if exc.code == "permission_denied":
        return f"coordd refused: {exc}"
    if exc.code in ("not_found", "bad_request"):
        return str(exc)
    return f"coordd answered {exc.code}: {exc}"
