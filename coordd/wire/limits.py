"""Wire Structs of fleet-wide limits (issue 17): `limits`, `limits_set`, `limits_reset`,
and `LimitUse`, the way a job names a limit it consumes. Data only, no I/O.

Registered in coordd.wire.protocol's PARAMS and ADMIN_METHODS; self-contained, so either
module may be imported first. Same evolution rules: new fields get defaults and go last.
"""

from __future__ import annotations

from typing import Any

import msgspec


class LimitUse(msgspec.Struct, kw_only=True):
    """A limit a job consumes: `units` of it while it runs (and of the rate at its claim)."""

    name: str
    units: int = 1


class LimitsQuery(msgspec.Struct, kw_only=True):
    """`limits`: every limit, or the one `name`; `holders` lists who holds units."""

    name: str | None = None
    holders: bool = True


class LimitHolder(msgspec.Struct, kw_only=True):
    """A running job holding units of a limit (times in coordd seconds)."""

    job_id: str
    worker_id: str
    priority: int
    units: int
    since: float


class LimitView(msgspec.Struct, kw_only=True):
    """A limit as `limits` shows it: its settings, where they come from, and its use now.

    `source` is `config`, `runtime` (set by `limits_set` only) or `config+runtime`;
    `rate_used` counts the units claimed in the last rate window; `next_slot_s` is the
    seconds until a rate unit frees (None: one is free, or no rate); `usable` is the units
    each priority p0..p3 may still take now (reserves held back).
    """

    name: str
    source: str
    concurrency: int | None = None
    rate: str | None = None
    reserve: dict[str, int] = {}
    used: int = 0
    rate_used: int = 0
    next_slot_s: float | None = None
    usable: dict[str, int | None] = {}
    waiting: int = 0  # waiting jobs that name this limit
    holders: list[LimitHolder] = []
    budget: dict[str, str] = {}          # metric -> "N/window" (reported usage on complete)
    budget_used: dict[str, float] = {}   # metric -> usage in the current window
    budget_reserve: dict[str, float] = {}  # p0..p2 -> share of each budget held back


class LimitsResult(msgspec.Struct, kw_only=True):
    """`limits` result, by name."""

    limits: list[LimitView] = []
    now: float = 0.0


class LimitSet(msgspec.Struct, kw_only=True):
    """`limits_set` (admin): change (or create) a limit at runtime; persisted in the DB, so
    a restart keeps it. `settings` keys: concurrency, rate, reserve, budget,
    budget_reserve; a key set to None removes that setting (e.g. no rate)."""

    name: str
    settings: dict[str, Any]


class LimitReset(msgspec.Struct, kw_only=True):
    """`limits_reset` (admin): drop the runtime override of `name` (back to the config)."""

    name: str


LIMIT_PARAMS: dict[str, type[msgspec.Struct]] = {
    "limits": LimitsQuery,
    "limits_set": LimitSet,
    "limits_reset": LimitReset,
}
"""The limits methods and their params Structs (merged into protocol.PARAMS)."""

LIMIT_ADMIN_METHODS = frozenset({"limits_set", "limits_reset"})
