"""What a claim needs from the config (ClaimPolicy) and priority aging: pure, the same on every
store (coordd.store.sqlite.claims walks SQLite with it; coordd.store.postgres passes it to its
SQL).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec

from coordd.rules import gates

CLAIM_SCAN = 16  # candidates a claim looks at per priority level before giving up on that level
BASE_REFUSALS_CACHED = 4096  # (priority, heartbeat text) pairs kept before starting over


class ClaimPolicy(msgspec.Struct, kw_only=True):
    """What claim needs from the config: gate policies per priority and timing knobs."""

    policies: dict[int, Any]  # priority -> coordd.rules.gates.GatePolicy
    heartbeat_stale_s: float
    aging_interval_s: float
    resources_seen: bool = False  # a job asked for resources: claims check requests
    limits: Any = None  # coordd.rules.limits.LimitBook (None or none defined: no limit work)
    # the kinds waiting per role, kept by the writer (coordd.store.sqlite.job_changes.
    # RoleKinds); None: read them from the claim index at each claim
    role_kinds: Any = None
    # the claim's read of its worker row, kept by the writer (coordd.store.sqlite.job_changes.
    # WorkerRows); None: read it at each claim
    worker_rows: Any = None
    # whether a reservation may exist (coordd.rules.preemption.ReservationHint); None: always look
    reservations: Any = None
    # (priority, the worker's stored heartbeat JSON) -> what that priority's own gates say
    _base: dict[tuple[int, str], list[tuple[str, str]]] = msgspec.field(default_factory=dict)

    def base_refusals(self, prio: int, heartbeat_json: str,
                      readings: Callable[[], dict[str, Any]]) -> list[tuple[str, str]]:
        """`gates.evaluate(policies[prio], readings())`, remembered per stored heartbeat
        text: a worker claims many times between two heartbeats, and the policies are
        fixed for coordd's life. Do not change the returned list."""
        key = (prio, heartbeat_json)
        got = self._base.get(key)
        if got is None:
            if len(self._base) >= BASE_REFUSALS_CACHED:
                self._base.clear()
            got = self._base[key] = gates.evaluate(self.policies[prio], readings())
        return got


def effective_priority(priority: int, queued_at: float, now: float, aging_s: float) -> int:
    """Priority after aging: one step better per `aging_s` seconds waited, never above P0."""
    if aging_s <= 0:
        return priority
    steps = max(0.0, now - queued_at) // aging_s
    return max(0, priority - int(steps)) if math.isfinite(steps) else 0
