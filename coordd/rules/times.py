"""The range of times and durations coordd accepts, and the one way to print a time.

Every time a client sends (a job's `run_at`, ...) must be a finite Unix time in
TIME_MIN_S..TIME_MAX_S, and every duration (`delay_s`, `max_runtime_s`, `lease_s`, a
gate's idle seconds, ...) a finite number of seconds in its own range; both are refused
at the boundary with `bad_request` naming the field and the range. `fmt_time` never
raises: a value stored before these checks (or written into the file by hand) is shown
as what it is, and no view fails on it. docs/decisions.md ("Times and numbers") says why
these bounds.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from coordd import errors

TIME_MIN_S = 0.0  # 1970-01-01T00:00:00Z
TIME_MAX_S = 4_102_444_800.0  # 2100-01-01T00:00:00Z
DURATION_MAX_S = 30 * 86400.0  # 30 days: longer is a mistake (or 1e308), not a plan
DELAY_MAX_S = 10 * 365 * 86400.0  # a job's delay / a message's ttl: 10 years at most


def check_time(what: str, value: float | None) -> None:
    """Refuse a time (Unix seconds) that is not finite or outside TIME_MIN_S..TIME_MAX_S
    (None: unset).

    Raises:
        errors.BadRequest: naming `what`, the range and the value.
    """
    if value is not None and not (math.isfinite(value) and TIME_MIN_S <= value <= TIME_MAX_S):
        raise errors.BadRequest(
            f"{what} must be a finite Unix time in {TIME_MIN_S:.0f}..{TIME_MAX_S:.0f} "
            f"({fmt_time(TIME_MIN_S)}..{fmt_time(TIME_MAX_S)}), got {value!r}")


def check_duration(what: str, value: float | None, limit: float = DURATION_MAX_S,
                   zero: bool = False) -> None:
    """Refuse a duration that is not a finite number of seconds in (0, `limit`] (None:
    unset; `zero` admits 0 too).

    Raises:
        errors.BadRequest: NaN, infinite, <= 0 (< 0 with `zero`) or over `limit`.
    """
    if value is None:
        return
    low_ok = value >= 0 if zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= limit):
        low = ">= 0" if zero else "> 0"
        raise errors.BadRequest(f"{what} must be {low} and at most {limit:g} s "
                                f"({limit / 86400:g} days), got {value!r}")


def fmt_time(ts: float | None) -> str:
    """Unix seconds as ISO-8601 UTC, seconds precision ("-" for None). Never raises: a
    value no calendar date can show (NaN, infinite, past year 9999, not a number) comes
    out as `<value> (not a valid time)`."""
    if ts is None:
        return "-"
    try:
        return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError, TypeError):
        return f"{ts!r} (not a valid time)"
