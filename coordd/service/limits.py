"""What the Coordinator checks and says of fleet-wide limits beside the claim: the
`limits` methods' names and checks, reported usage on `complete`, a waiting job's limit
reason (the methods: coordd.service.areas; the views: coordd.rules.limits.limit_view).

Runtime overrides are stored first and only then installed in the LimitBook the claim
reads (coordd.rules.limits), so a claim never admits on a setting that is not yet durable; a
restart loads them again.
"""

from __future__ import annotations

import math
from typing import Any

from coordd import errors
from coordd.rules.limits import LimitBook, check_metric
from coordd.wire.limits import LimitsQuery

LIMIT_METHODS = ("limits", "limits_set", "limits_reset")
USAGE_METRICS_MAX = 16


def check_usage(usage: dict[str, float] | None) -> dict[str, float] | None:
    """Check a `complete`'s reported usage (None when there is none).
    Raises: errors.BadRequest."""
    if not usage:
        return None
    if len(usage) > USAGE_METRICS_MAX:
        raise errors.BadRequest(f"usage: at most {USAGE_METRICS_MAX} metrics")
    for metric, amount in usage.items():
        try:
            check_metric("usage", metric)
        except ValueError as exc:
            raise errors.BadRequest(str(exc)) from exc
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) \
                or not math.isfinite(amount) or amount < 0:
            raise errors.BadRequest(f"usage.{metric} must be a finite number >= 0, "
                                    f"got {amount!r}")
    return usage


def names_asked(book: LimitBook, p: LimitsQuery) -> list[str]:
    """The limits a `limits` call shows. Raises: errors.NotFound (no such limit)."""
    if p.name is None:
        return list(book.defs)
    if p.name not in book.defs:
        raise errors.NotFound(f"no limit {p.name!r} (known: {', '.join(book.defs) or 'none'})")
    return [p.name]


def check_override(book: LimitBook, name: str) -> None:
    """Raise errors.NotFound unless `name` has a runtime override (`limits_reset`)."""
    if not book.has_override(name):
        raise errors.NotFound(f"limit {name!r} has no runtime override")


def put_reason(job: Any, reason: str) -> None:
    """Put a limit's `reason` in front of a job view's waiting_reason (instead of "runnable")."""
    old = job.waiting_reason
    job.waiting_reason = reason if not old or old.startswith("runnable") else f"{reason}; {old}"
