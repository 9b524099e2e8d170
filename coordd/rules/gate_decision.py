"""A claim's gate decision made outside SQL: from a worker's last heartbeat to the
priorities it may claim now, with the reasons for the others.

Pure (readings and policies in, a verdict out). A store whose claim is one SQL statement
(coordd.store.postgres) filters candidates with it, as `coordd.store.sqlite.leases` applies the same
policies candidate by candidate; both use `ClaimPolicy.base_refusals`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.rules.claim_policy import ClaimPolicy
from coordd.jsontext import lenient_json

PRIORITIES = (0, 1, 2, 3)


class GateDecision(msgspec.Struct, kw_only=True):
    """`allowed`: priorities the worker may claim; `refused`: priority -> its refusals
    (code, detail); `stale`: why it may claim nothing at all (`heartbeat_stale`), or None."""

    allowed: list[int]
    refused: dict[int, list[tuple[str, str]]] = {}
    stale: str | None = None

    def reasons(self, priorities: list[int]) -> dict[str, str]:
        """Refusal code -> first detail, over the refused `priorities` given (those where
        a candidate waits), in priority order."""
        out: dict[str, str] = {}
        for prio in sorted(priorities):
            for code, detail in self.refused.get(prio, ()):
                out.setdefault(code, detail)
        return out


def decide(policy: ClaimPolicy, heartbeat_json: str | None, heartbeat_at: float | None,
           now: float) -> GateDecision:
    """The priorities whose gates pass on the worker's stored readings at `now`.

    A worker never heard from, or heard from longer than `heartbeat_stale_s` ago, may
    claim nothing (`stale` says why; the code is coordd.rules.gates.HEARTBEAT_STALE).
    """
    if heartbeat_json is None or heartbeat_at is None:
        return GateDecision(allowed=[], stale="never sent a heartbeat")
    age = now - heartbeat_at
    if age > policy.heartbeat_stale_s:
        return GateDecision(
            allowed=[], stale=f"last heartbeat {age:.1f}s ago > {policy.heartbeat_stale_s:g}s")
    readings: dict[str, Any] | None = None

    def read() -> dict[str, Any]:
        nonlocal readings
        if readings is None:
            readings = lenient_json(heartbeat_json, {})
        return readings
    allowed, refused = [], {}
    for prio in PRIORITIES:
        refusals = policy.base_refusals(prio, heartbeat_json, read)
        if refusals:
            refused[prio] = list(refusals)
        else:
            allowed.append(prio)
    return GateDecision(allowed=allowed, refused=refused)
