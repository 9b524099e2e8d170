"""The one check for every name coordd accepts: worker ids, roles, kinds, idempotency keys,
hub names, workflow, node and schedule names.

A name ends up in coordd's log lines, in coordctl's tables and in other names (a
schedule's workflows); a control character in one could forge a log line or rewrite a
terminal, and a bidi override could make `a` read as something else. So besides its length
(1..`limit` characters) a name may not contain C0 or C1 control characters, DEL, the line
and paragraph separators U+2028/U+2029, or the bidi embeddings, overrides and isolates
U+202A..U+202E and U+2066..U+2069.

Beside it, for the same reason (one check that every entry point shares): the bound on a
duration a request sets, such as `max_runtime_s`, and on a time, such as `run_at`.
"""

from __future__ import annotations

import math
import re

from coordd import errors

NAME_MAX_CHARS = 200
DURATION_MAX_S = 30 * 86400.0  # 30 days: longer is a mistake (or 1e308), not a plan
FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def check_name(what: str, value: str, limit: int = NAME_MAX_CHARS) -> None:
    """Refuse an empty or too long name, or one with a forbidden character.

    Raises:
        errors.BadRequest: naming `what`, the rule, and the first forbidden character.
    """
    if not value or len(value) > limit:
        raise errors.BadRequest(f"{what} must be 1..{limit} characters")
    bad = FORBIDDEN.search(value)
    if bad is not None:
        raise errors.BadRequest(
            f"{what} must not contain control or bidi-override characters "
            f"(U+{ord(bad.group()):04X} at position {bad.start()})")


def escape(text: str) -> str:
    """`text` with each forbidden character written as an escape (`\\n`, `\\u202e`), for a
    log line that must stay one line."""
    return FORBIDDEN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def check_duration(what: str, value: float | None, limit: float = DURATION_MAX_S) -> None:
    """Refuse a duration that is not a finite number of seconds in (0, `limit`] (None: unset).

    Raises:
        errors.BadRequest: NaN, infinite, <= 0 or over `limit`.
    """
    if value is not None and not (math.isfinite(value) and 0 < value <= limit):
        raise errors.BadRequest(f"{what} must be > 0 and at most {limit:g} s "
                                f"({limit / 86400:g} days), got {value!r}")


def check_time(what: str, value: float | None) -> None:
    """Refuse a time (Unix seconds) that is NaN or infinite (None: unset).

    Raises:
        errors.BadRequest: not a finite number.
    """
    if value is not None and not math.isfinite(value):
        raise errors.BadRequest(f"{what} must be a finite Unix time, got {value!r}")
