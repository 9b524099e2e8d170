"""Governance of running work as the Coordinator shows it: the preemption pacer built
from the config, and what `get_job` says of a lease's grant and a job's reservation.
The decisions themselves are coordd.rules.governance's and coordd.rules.preemption's, run by the
stores inside the heartbeat's and renew's transaction (coordd.store.api_governance).
"""

from __future__ import annotations

from typing import Any

from coordd.rules import preemption
from coordd.rules import resources
from coordd.config import Config
from coordd.rules.times import fmt_time


def preemptor(config: Config) -> preemption.Preemptor:
    """The preemption pacer with the config's knobs (one per coordd, on either store)."""
    return preemption.Preemptor(preemption.PreemptPolicy(
        gap=config.preempt_gap, min_runtime_s=config.preempt_min_runtime_s,
        reservation_s=config.reservation_s, stale_s=config.heartbeat_stale_s))


def granted_view(grant: resources.Grant | None) -> dict[str, Any] | None:
    """A lease's grant as `get_job` shows it (`granted`), or None."""
    return None if grant is None else {
        "gpu_ids": list(grant.gpu_ids), "vram_mb": grant.vram_mb, "ram_mb": grant.ram_mb}


def reserved_reason(held: tuple[Any, ...] | None, now: float | None) -> str | None:
    """A waiting job's reason from its reservation (worker_id, victim job, victim
    priority, expires_at), while it lives at `now` (None: the store found it live);
    None otherwise."""
    if held is None or (now is not None and held[3] <= now):
        return None
    return (f"reserved on {held[0]}: waiting for P{held[2]} job {held[1]} to vacate "
            f"(until {fmt_time(held[3])})")
