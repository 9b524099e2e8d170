"""The one check for every name coordd accepts: worker ids, roles, kinds, idempotency keys,
hub names, workflow, node and schedule names.

A name ends up in coordd's log lines, in coordctl's tables and in other names (a
schedule's workflows); a control character in one could forge a log line or rewrite a
terminal, and a bidi override could make `a` read as something else. So besides its length
(1..`limit` characters) a name may not contain C0 or C1 control characters, DEL, the line
and paragraph separators U+2028/U+2029, or the bidi embeddings, overrides and isolates
U+202A..U+202E and U+2066..U+2069.

The bounds on a time or duration a request sets (`check_time`, `check_duration`) live in
coordd.rules.times and are re-exported here for the modules that import them from this one.
"""

from __future__ import annotations

import re

from coordd import errors
from coordd.rules.times import DURATION_MAX_S, check_duration, check_time  # noqa: F401

NAME_MAX_CHARS = 200
FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def check_name(what: str, value: str, limit: int = NAME_MAX_CHARS) -> None:
    """Refuse an empty or too long name, or one with a forbidden character.

    Raises:
        errors.BadRequest: naming `what`, the rule, and the first forbidden character.
    """
    if not value or len(value) > limit:
        raise errors.BadRequest(f"{what} must be 1..{limit} characters")
    check_id(what, value)


def check_id(what: str, value: str) -> None:
    """Refuse an id (or an id's prefix) a caller names that holds a forbidden character:
    coordd's ids never do, and PostgreSQL's text cannot even hold a NUL. An empty or
    unknown id is left to the lookup (`not_found`).

    Raises:
        errors.BadRequest: naming `what` and the first forbidden character.
    """
    if value.isascii() and value.isprintable():
        return  # U+0020..U+007E only: no forbidden character (the common case, no regex)
    bad = FORBIDDEN.search(value)
    if bad is not None:
        raise errors.BadRequest(
            f"{what} must not contain control or bidi-override characters "
            f"(U+{ord(bad.group()):04X} at position {bad.start()})")


def escape(text: str) -> str:
    """`text` with each forbidden character written as an escape (`\\n`, `\\u202e`), for a
    log line that must stay one line."""
    return FORBIDDEN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
