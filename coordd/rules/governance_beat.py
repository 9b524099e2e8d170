"""A heartbeat that changed nothing that matters (issue 30): which beats coordd answers from
memory, and how long a worker's last-seen time may wait in memory before it is stored.

A beat matters (the store records it, preemption may run, governance decides for every held
job) when any of these holds; otherwise it is quiet (coordd.service.beats answers it from
the last full beat's reply and keeps its time in memory):

- the worker is new to this coordd (a restart or a fail-over starts with none known);
- its roles, incarnation, kinds or broken kinds differ from the last full beat's;
- a reading crossed a threshold: the refusal codes `gates.evaluate` gives differ under any
  gate policy that applies (each priority's, and those of the jobs it holds, with their own
  overrides), or the critical temperature's side differs;
- a reading no gate compares with a threshold (GPU devices, slots, anything not in
  `GAUGES`) changed at all;
- a job it holds is not plainly running (a cancel, suspension, vacate or lost lease: its
  next decision depends on time), or changed since (a claim, an end, a cancel, a
  preemption: coordd.service.beats bumps its generation);
- the stored copy is older than `Timing.fresh_s` (last-seen) or `Timing.refresh_s`
  (readings and reply).

Liveness stays exact: the stored heartbeat time is at most `fresh_s` behind the in-memory
one when a quiet beat is taken, and a flush (every `flush_s`) stores it; with
`fresh_s + 2 * flush_s <= stale_s` no check on stored rows (claim freshness, preemption's
live workers, `worker_absent`, `status`) ever calls a live worker stale, and one that stops
beating is stale at its last beat + `stale_s`, as before. After a restart the stored time may
miss up to `fresh_s` of a worker's life: `restart_bound_s` is what the restart grace adds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from coordd.rules import gates
from coordd.rules.gates import GatePolicy
from coordd.rules.governance import _policy_for

# Readings the gates only compare with thresholds: a change that crosses none is quiet.
GAUGES = frozenset(("memory_used_pct", "temperature_c", "gpu_temperature_c", "user_idle_s",
                    "battery_pct"))


class Timing(msgspec.Struct, frozen=True, kw_only=True):
    """How long a quiet beat's time may stay in memory (seconds).

    Attributes:
        stale_s: the config's heartbeat_stale_s.
        flush_s: how often the in-memory last-seen times are stored (one batch).
        fresh_s: a beat is quiet only while the stored time is younger than this.
        refresh_s: a beat is quiet only while the last full beat is younger than this.
    """

    stale_s: float
    flush_s: float
    fresh_s: float
    refresh_s: float


def timing(stale_s: float, round_s: float) -> Timing:
    """The bounds for `heartbeat_stale_s` = `stale_s` with flushes every `round_s` (the
    maintenance round): fresh_s = min(stale_s / 2, stale_s - 2 * round_s), so a flush late
    by up to a round still lands in time. fresh_s <= 0 means no beat is ever quiet."""
    fresh = min(stale_s / 2, stale_s - 2 * round_s)
    return Timing(stale_s=stale_s, flush_s=round_s, fresh_s=max(0.0, fresh),
                  refresh_s=2 * stale_s)


def restart_bound_s(t: Timing) -> float:
    """How much later than its stored time a worker may have been seen by a coordd that
    stopped (a quiet beat's time not yet flushed): the restart grace's liveness part."""
    return t.fresh_s


def policies_of(policies: dict[int, GatePolicy],
                held: Iterable[tuple[int, str | None]]) -> tuple[GatePolicy, ...]:
    """The distinct gate policies that apply to a worker: each priority's and those of the
    jobs it holds, (priority, gates JSON) as the stores read them."""
    out: list[GatePolicy] = []
    for policy in (*policies.values(), *(_policy_for(policies, p, g) for p, g in held)):
        if policy not in out:
            out.append(policy)
    return tuple(out)


# gauge -> the GatePolicy fields that hold its thresholds (coordd.rules.gates.evaluate and
# coordd.rules.governance.closed_gates compare each gauge only with these)
THRESHOLDS = {
    "memory_used_pct": ("max_memory_pct",),
    "temperature_c": ("max_temperature_c", "critical_temperature_c"),
    "gpu_temperature_c": ("max_gpu_temperature_c",),
    "user_idle_s": ("min_user_idle_s",),
    "battery_pct": ("min_battery_pct",),
}


def thresholds(policies: tuple[GatePolicy, ...]) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """(gauge, its distinct thresholds, sorted) over `policies`."""
    out = []
    for gauge, fields in THRESHOLDS.items():
        values = {getattr(p, f) for p in policies for f in fields}
        out.append((gauge, tuple(sorted(v for v in values if v is not None))))
    return tuple(out)


def signature(limits: tuple[tuple[str, tuple[float, ...]], ...],
              readings: dict[str, Any]) -> tuple[Any, ...]:
    """Which side of every threshold (`thresholds`) `readings` are on: per gauge, None
    (unknown, as the gates read it) or the signs of reading - threshold. Equal signatures:
    no gate and no governance decision of a running job can tell the two readings apart
    (both are functions of these comparisons and of the other readings, `rest`)."""
    out: list[Any] = []
    for gauge, limits_of in limits:
        v = gates._num(readings.get(gauge))
        out.append(None if v is None else tuple((v > t) - (v < t) for t in limits_of))
    return tuple(out)


def rest(readings: dict[str, Any]) -> dict[str, Any]:
    """The readings no gate only thresholds: compared exactly."""
    return {k: v for k, v in readings.items() if k not in GAUGES}
