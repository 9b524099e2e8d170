"""Governance of running work: what each held job's process must be doing now.

`decide` is the one function that says `continue`, `suspend`, `resume` or `vacate` for a running
job from its priority's GatePolicy, the worker's last readings and the lease's governance state;
it is pure, as is everything here. Each store runs `plan` inside the heartbeat's (all the
worker's leases) and renew's (that lease) transaction, stores the new state on the lease row and
logs each transition as an event (SQLite: coordd.store.sqlite.governance_ops.govern; PostgreSQL:
coordd.store.postgres.governance). The worker only acts on the answer, and `coordctl
show`/`workers` print the stored state, so the three never disagree.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.rules import gates
from coordd.rules.gates import GatePolicy
from coordd.wire.governance import JobAction
from coordd.jsontext import json_decode
from coordd.rules.times import fmt_time

CONTINUE, SUSPEND, RESUME, VACATE = "continue", "suspend", "resume", "vacate"
CRITICAL = "critical_temperature"


class GovState(msgspec.Struct, frozen=True, kw_only=True):
    """A lease's governance state (None everywhere: running normally).

    Attributes:
        suspended_at: coordd time the job was suspended (s), or None.
        suspend_reason: the reason codes that hold it now, e.g. "user_active" (updated
            when the cause changes while it stays suspended).
        gate_open_at: while suspended, since when its gates are open again (s), or None.
        vacate_reason: set once a vacate is decided; kept until the lease ends.
        resume_at: while its gates are open, when it resumes if they stay open (s).
    """

    suspended_at: float | None = None
    suspend_reason: str | None = None
    gate_open_at: float | None = None
    vacate_reason: str | None = None
    resume_at: float | None = None


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What `decide` says: the action, its reason, the new state and the event text to
    log (None: no transition)."""

    action: str
    reason: str | None
    state: GovState
    event: str | None = None


def closed_gates(policy: GatePolicy, readings: dict[str, Any],
                 hysteresis: bool = False) -> list[tuple[str, str]]:
    """The gates that hold a running job: the claim gates where `on_close` is not
    "continue", plus the critical temperature at every priority. With `hysteresis`, the
    temperature limits are lowered by `temperature_hysteresis_c` (the resume rule)."""
    drop = policy.temperature_hysteresis_c if hysteresis else 0.0
    out: list[tuple[str, str]] = []
    if policy.on_close != CONTINUE:
        strict = policy
        if drop and policy.max_temperature_c is not None:
            strict = msgspec.structs.replace(policy,
                                             max_temperature_c=policy.max_temperature_c - drop)
        if drop and policy.max_gpu_temperature_c is not None:
            strict = msgspec.structs.replace(
                strict, max_gpu_temperature_c=policy.max_gpu_temperature_c - drop)
        out = gates.evaluate(strict, readings)
    crit = policy.critical_temperature_c
    temp = gates._num(readings.get("temperature_c"))
    if crit is not None and temp is not None and temp > crit - drop:
        out.append((CRITICAL, f"temperature {temp:g} > critical {crit - drop:g}"))
    return out


def _codes(closed: list[tuple[str, str]]) -> str:
    return ",".join(dict.fromkeys(code for code, _ in closed))


def _why(closed: list[tuple[str, str]]) -> str:
    return f"{_codes(closed)} ({'; '.join(detail for _, detail in closed)})"


def decide(policy: GatePolicy, readings: dict[str, Any], state: GovState,
           now: float) -> Decision:
    """Decide for one running job (times in coordd seconds).

    Rules: a vacate once decided stands until the lease ends. A running job whose gates
    close is suspended (`on_close = "suspend"`, or any priority above the critical
    temperature) or vacated (`on_close = "vacate"`). A suspended job is vacated once
    suspended `max_suspend_s`; it resumes only after its gates stayed open, with the
    temperature below the limit minus `temperature_hysteresis_c`, for `resume_after_s`.
    While suspended, the stored reason follows the gates that hold it now (a change is an
    event), and while they are open the state says when it resumes (`resume_at`; not an
    event: gates that flap would flood the job's log).
    """
    if state.vacate_reason is not None:
        return Decision(action=VACATE, reason=state.vacate_reason, state=state)
    if state.suspended_at is None:
        closed = closed_gates(policy, readings)
        if not closed:
            return Decision(action=CONTINUE, reason=None, state=state)
        why = _why(closed)
        if policy.on_close == VACATE and all(code != CRITICAL for code, _ in closed):
            new = GovState(vacate_reason=why)
            return Decision(action=VACATE, reason=why, state=new, event=f"vacate: {why}")
        new = GovState(suspended_at=now, suspend_reason=_codes(closed))
        return Decision(action=SUSPEND, reason=why, state=new, event=f"suspended: {why}")
    held_s = now - state.suspended_at
    if held_s >= policy.max_suspend_s:
        why = (f"max_suspend_s: suspended {held_s:g}s >= {policy.max_suspend_s:g}s "
               f"({state.suspend_reason})")
        new = msgspec.structs.replace(state, vacate_reason=why, resume_at=None)
        return Decision(action=VACATE, reason=why, state=new, event=f"vacate: {why}")
    closed = closed_gates(policy, readings, hysteresis=True)
    if closed:
        why, codes = _why(closed), _codes(closed)
        new = msgspec.structs.replace(state, suspend_reason=codes, gate_open_at=None,
                                      resume_at=None)
        note = None if codes == state.suspend_reason else \
            f"suspended: now {why}, was {state.suspend_reason}"
        return Decision(action=SUSPEND, reason=why, state=new, event=note)
    open_at = state.gate_open_at if state.gate_open_at is not None else now
    if now - open_at >= policy.resume_after_s:
        why = (f"gates open for {now - open_at:g}s >= {policy.resume_after_s:g}s "
               f"after {held_s:g}s suspended ({state.suspend_reason})")
        return Decision(action=RESUME, reason=why, state=GovState(), event=f"resumed: {why}")
    resume_at = open_at + policy.resume_after_s
    why = (f"{state.suspend_reason}: gates open since {fmt_time(open_at)}, resumes at "
           f"{fmt_time(resume_at)} if they stay open (resume_after_s "
           f"{policy.resume_after_s:g}s)")
    new = msgspec.structs.replace(state, gate_open_at=open_at, resume_at=resume_at)
    return Decision(action=SUSPEND, reason=why, state=new)


def describe(job_id: str, suspended_at: float | None, suspend_reason: str | None,
             vacate_reason: str | None, resume_at: float | None = None) -> str:
    """One line for `coordctl workers`/`show`: "JOB suspended since T (reason)" (then
    ", resumes at T2 if its gates stay open" while they are open) or "JOB vacating
    (reason)"."""
    if vacate_reason is not None:
        return f"{job_id} vacating ({vacate_reason})"
    at = "?" if suspended_at is None else fmt_time(suspended_at)
    return f"{job_id} suspended since {at} ({suspend_reason}){_resuming(resume_at)}"


def _resuming(resume_at: float | None) -> str:
    if resume_at is None:
        return ""
    return f", resumes at {fmt_time(resume_at)} if its gates stay open"


def _policy_for(policies: dict[int, GatePolicy], prio: int, gates_json: str | None) -> GatePolicy:
    policy = policies[prio]
    if gates_json is None:
        return policy
    try:
        return gates.merge(policy, json_decode(gates_json))
    except (msgspec.ValidationError, msgspec.DecodeError):
        return policy  # the claim dead-letters such jobs; a held one runs on its level's rules


class Step(msgspec.Struct, frozen=True):
    """One held job's decision (`govern`'s and every store's): the state it had, what
    `decide` said, and the (action, reason code) of its transition (None: none)."""

    job_id: str
    before: GovState
    decision: Decision
    change: tuple[str, str] | None


def plan(policies: dict[int, GatePolicy], readings: Any, now: float,
         rows: list[Any]) -> list[Step]:
    """Decide for held jobs, pure: `rows` are (job_id, priority, gates_json, suspended_at,
    suspend_reason, gate_open_at, vacate_reason, resume_at) as the stores read them,
    `readings` the worker's last (anything not a map counts as none). A store writes each
    step whose `decision.state` differs from `before`, and logs `decision.event` when set;
    `change` is set only where the action changes (a new reason or resume time is not)."""
    if not isinstance(readings, dict):
        readings = {}
    steps: list[Step] = []
    for jid, prio, gates_json, suspended_at, suspend_reason, open_at, vacate, resume in rows:
        state = GovState(suspended_at=suspended_at, suspend_reason=suspend_reason,
                         gate_open_at=open_at, vacate_reason=vacate, resume_at=resume)
        d = decide(_policy_for(policies, prio, gates_json), readings, state, now)
        change = None
        if d.event is not None and _mode(d.state) != _mode(state):
            code = (d.state.suspend_reason or state.suspend_reason or "").split(",")[0]
            if d.action == VACATE:
                code = "max_suspend_s" if d.reason and d.reason.startswith("max_suspend_s") \
                    else (d.reason or "").split(" ")[0].split(",")[0]
            change = (d.action, code or "unknown")
        steps.append(Step(job_id=jid, before=state, decision=d, change=change))
    return steps


def _mode(s: GovState) -> str:
    return VACATE if s.vacate_reason is not None else (
        SUSPEND if s.suspended_at is not None else CONTINUE)


def outcome(steps: list[Step]) -> tuple[list[JobAction], list[tuple[str, str]]]:
    """(one JobAction per step, [(action, reason code)] of the transitions)."""
    return ([JobAction(job_id=s.job_id, action=s.decision.action, reason=s.decision.reason)
             for s in steps], [s.change for s in steps if s.change is not None])
