"""The worker's side of governance of running work: act on coordd's per-job actions.

coordd decides (coordd.rules.governance); this module only acts, and every action is
idempotent because coordd repeats its answer on each heartbeat and renew: `suspend`
SIGSTOPs the model's group unless it is stopped, `resume`/`continue` SIGCONT it if it is,
`vacate` ends the job (SIGCONT, SIGTERM, the kind's grace, SIGKILL) and the supervisor
then hands it back with `release`, spending no attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

VACATE_PREFIX = "vacate"
"""An abort reason that starts with this hands the job back (`release`) with that reason."""


def act(run: Any, action: str, reason: str | None, now: float) -> None:
    """Apply coordd's `action` for one held job (a supervisor JobRun, or None: not ours);
    `now` is the worker's monotonic time (the stopped time is kept, see `stopped_since`)."""
    if run is None or run.aborted.is_set():
        return
    if action == "vacate":
        logger.warning("job %s: vacating (%s)", run.job_id, reason,
                       extra={"action": "vacate", "job_id": run.job_id, "reason": reason})
        run.abort(f"{VACATE_PREFIX}d: {reason}")
        return
    proc = run.proc
    if proc is None:
        return  # not started yet: coordd says it again on the next heartbeat
    if action == "suspend" and not proc.stopped:
        if proc.suspend(now):
            logger.info("job %s: suspended (SIGSTOP) - %s", run.job_id, reason,
                        extra={"action": "suspend", "job_id": run.job_id, "reason": reason})
    elif action in ("resume", "continue") and proc.stopped:
        if proc.resume(now):
            logger.info("job %s: resumed (SIGCONT) - %s", run.job_id, reason,
                        extra={"action": "resume", "job_id": run.job_id, "reason": reason})


def stopped_since(proc: Any, counted: float, now: float) -> tuple[float, float]:
    """For the kind's timeout, which counts run time only: (seconds the model was stopped
    beyond the `counted` ones - the timer's extension -, the new count)."""
    total = 0.0 if proc is None else proc.stopped_s(now)
    return total - counted, total


def watch_act(held: Callable[[], dict[str, Any]],
              mono: Callable[[], float]) -> Callable[[str, str, str | None], None]:
    """The control watch's `act` (worker.control.ControlWatch) over the held runs by job id
    and the worker's monotonic clock: a cancel asks the run to end; suspend / resume /
    vacate go to `act`."""
    def on_action(job_id: str, action: str, reason: str | None) -> None:
        run = held().get(job_id)
        if action == "cancel":
            if run is not None:
                run.request_cancel()
        else:
            act(run, action, reason, mono())
    return on_action


def capacity(config: Any) -> dict[str, Any]:
    """The heartbeat readings that tell coordd this worker's room (coordd.rules.preemption):
    `slots_total` and `slots` per kind, from the worker config."""
    return {"slots_total": config.total_slots,
            "slots": {name: kind.slots for name, kind in config.kinds.items()}}


def is_vacate(reason: str | None) -> bool:
    """Whether a job's abort reason is a vacate (its hand-back reason is the text)."""
    return reason is not None and reason.startswith(VACATE_PREFIX)
