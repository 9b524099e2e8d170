"""Why a waiting job is not running, in plain words: the one explainer behind `show`,
`list`, `workflow show` (and any other view that says why a job waits).

The claim decides with the same rules (coordd.rules.gates, coordd.rules.worker_state); this
module only words them for a person.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.rules import gates
from coordd.wire.protocol import JobView
from coordd.rules.worker_state import WorkerState, kind_absent_reason, runs_kind
from coordd.rules.times import fmt_time


def why_waiting(job: JobView, now: float, workers: list[Any],
                states: dict[str, WorkerState], policies: dict[int, Any],
                stale_s: float) -> str:
    """Say why waiting `job` is not running at `now` (Unix s): backoff or a later run_at, no
    live worker with its role or its kind, or which gate (with the job's own gate
    overrides) refuses on which worker, with the reading.

    `workers`: rows (worker_id, roles, readings, heartbeat_at, n) as
    coordd.store.views.list_workers returns them; `states`: the workers' lifecycle states;
    `policies`: the gate policy per priority; `stale_s`: a heartbeat older than this is not
    live.
    """
    if job.run_at > now:
        what = "backoff" if job.attempts else "scheduled"
        return f"{what} until {fmt_time(job.run_at)}"
    live = live_workers(job.required_role, now, workers, states, stale_s)
    if not live:
        return f"no live worker with role {job.required_role}"
    runners = [w for w in live if runs_kind(states.get(w[0]), job.kind)]
    if not runners:
        return kind_absent_reason(job.kind, [w[0] for w in live], states)
    policy = _policy(job, policies)
    refused = []
    for worker_id, _roles, readings, hb_at, _n in runners:
        refusals = gates.evaluate(policy, readings)
        if not refusals:
            return "runnable: waiting for a worker to claim it"
        detail = "; ".join(d for _, d in refusals)
        refused.append(f"gate {detail} on {worker_id} (checked {fmt_time(hb_at)})")
    return "; ".join(refused)


def live_workers(role: str, now: float, workers: list[Any],
                 states: dict[str, WorkerState], stale_s: float) -> list[Any]:
    """The rows of `workers` with `role` whose heartbeat is fresh at `now` (within
    `stale_s`) and that have not said goodbye."""
    return [w for w in workers if role in w[1] and now - w[3] <= stale_s
            and (w[0] not in states or states[w[0]].offline_at is None)]


def open_runners(job: JobView, now: float, workers: list[Any],
                 states: dict[str, WorkerState], policies: dict[int, Any],
                 stale_s: float) -> list[Any]:
    """The live workers that take `job`'s role and kind and whose gates are open for it:
    where only resources can keep it waiting (coordd.rules.resources.shortfall words them)."""
    policy = _policy(job, policies)
    return [w for w in live_workers(job.required_role, now, workers, states, stale_s)
            if runs_kind(states.get(w[0]), job.kind) and not gates.evaluate(policy, w[2])]


def _policy(job: JobView, policies: dict[int, Any]) -> Any:
    """The job's priority's gate policy with the job's own overrides (a bad override, as
    stored before it was checked: the priority's policy)."""
    try:
        return gates.merge(policies[job.priority], job.gates)
    except msgspec.ValidationError:
        return policies[job.priority]
