"""Storage health: which SQLite errors mean "the disk refused" (full, I/O error, cannot open
a file), and an episode of them logged once and then at most every LOG_EVERY_S.

The rule not to break: a storage refusal is `unavailable` (retryable, the reason in the
message), never `internal`, and a full disk does not flood the log (issue 21).
"""

from __future__ import annotations

import logging
import sqlite3
from datetime import datetime, timezone

from coordd import errors

logger = logging.getLogger(__name__)

LOG_EVERY_S = 60.0
CLEAR_AFTER_S = 5.0  # an episode ends at a commit this long after its last refusal
# Primary result codes (the low byte of an extended code): https://sqlite.org/rescode.html
SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN = 10, 13, 14
REASONS = {SQLITE_FULL: "disk full", SQLITE_IOERR: "I/O error",
           SQLITE_CANTOPEN: "cannot open a database file"}


def storage_reason(exc: BaseException | None) -> str | None:
    """"disk full" / "I/O error" / "cannot open a database file" when `exc` (or its cause)
    is such an SQLite error, else None."""
    seen = 0
    while exc is not None and seen < 4:
        if isinstance(exc, sqlite3.Error):
            code = getattr(exc, "sqlite_errorcode", None)
            if code is not None:
                return REASONS.get(code & 0xFF)
            text = str(exc)  # no code (an old sqlite3 module): SQLite's own messages
            if "disk is full" in text:
                return REASONS[SQLITE_FULL]
            if "disk I/O error" in text:
                return REASONS[SQLITE_IOERR]
            return None
        exc, seen = exc.__cause__, seen + 1
    return None


class StorageHealth:
    """Count storage refusals: log the first of an episode, then a summary at most every
    LOG_EVERY_S; the episode ends at the first commit CLEAR_AFTER_S after its last refusal
    (so a disk that refuses big writes and takes small ones is one episode, not a flood).
    Times: `wall` Unix seconds, `mono` monotonic seconds."""

    def __init__(self) -> None:
        self.reason: str | None = None  # set while an episode is on
        self.since_wall = 0.0
        self.refused = 0                # requests refused in this episode
        self._last_mono = 0.0           # the episode's last refusal
        self._logged_mono = 0.0
        self._unlogged = 0

    def refuse(self, exc: BaseException, reason: str, n: int, wall: float,
               mono: float) -> errors.Unavailable:
        """Note that `n` requests were refused for `reason`; return the error they get."""
        if self.reason is None:
            self.since_wall, self.refused, self._unlogged = wall, 0, 0
            logger.error("storage refused a write (%s): %s; requests get `unavailable` until "
                         "it clears (repeats summed up every %.0fs)", reason, exc, LOG_EVERY_S,
                         extra={"action": "storage_unavailable", "reason": reason, "n": n})
            self._logged_mono = mono
        elif mono - self._logged_mono >= LOG_EVERY_S:
            logger.error("storage still refusing writes (%s): %d request(s) refused since "
                         "the last report: %s", reason, self._unlogged + n, exc,
                         extra={"action": "storage_unavailable", "reason": reason,
                                "n": self._unlogged + n})
            self._logged_mono, self._unlogged = mono, 0
        else:
            self._unlogged += n
        self.reason = reason
        self.refused += n
        self._last_mono = mono
        return errors.Unavailable(f"{reason}: {exc}; nothing was stored, retry later")

    def committed(self, mono: float) -> None:
        """A commit went through: end the episode if its last refusal is CLEAR_AFTER_S old."""
        if self.reason is not None and mono - self._last_mono >= CLEAR_AFTER_S:
            logger.warning("storage takes writes again after %s (%d request(s) refused)",
                           self.reason, self.refused,
                           extra={"action": "storage_recovered", "n": self.refused})
            self.reason = None

    def warning(self) -> str | None:
        """A `status` warning while an episode is on, else None."""
        if self.reason is None:
            return None
        since = datetime.fromtimestamp(self.since_wall, timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        return f"{self.reason}: writes refused (unavailable) since {since}, " \
               f"{self.refused} request(s) so far; free space or fix the disk"
