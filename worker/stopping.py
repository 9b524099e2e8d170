"""What a worker's stop does to each job it holds, said in its stop line.

The rule not to break: the line says what goes out for each job, read from the job's
state at the stop: a model that exited 0 has its result reported (`completing`), one that
exited otherwise, timed out or was cancelled is reported failed (`failing`), one still
running (or not started) is killed and released (`handing back`), and a job whose lease
is gone gets no report (`dropping`). A model that exits between the line and its kill is
reported after all; `confirm` then logs the change, so the log never stays wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from worker import governance
from worker.jobrun import CANCELLED, TIMEOUT, JobRun
from worker.process import classify_exit
from worker.waits import signame

logger = logging.getLogger("worker.supervisor")

COMPLETING, FAILING, HANDING_BACK, DROPPING = "completing", "failing", "handing back", "dropping"


def fate(run: JobRun) -> tuple[str, str]:
    """(what the stop does to `run`: COMPLETING, FAILING, HANDING_BACK or DROPPING; why)."""
    if run.lease_gone:
        return DROPPING, "its lease is gone, nothing is reported"
    proc = run.proc
    if proc is not None and proc.returncode is not None and not proc.killed_by_us:
        rc = proc.returncode
        what = f"its model exited {rc}" if rc >= 0 else f"its model was killed by {signame(-rc)}"
        return (COMPLETING if classify_exit(rc, False) == "success" else FAILING), what
    if run.abort_reason == CANCELLED:
        return FAILING, "cancelled"
    if run.abort_reason == TIMEOUT:
        return FAILING, "timed out"
    if governance.is_vacate(run.abort_reason):
        return HANDING_BACK, str(run.abort_reason)
    return HANDING_BACK, "its model is running" if proc is not None else "its model has not started"


def announce(runs: Iterable[JobRun]) -> None:
    """Log the stop line: each job held and its fate (kept on the run for `confirm`)."""
    parts, fates = [], {}
    for run in runs:
        run.stop_fate, why = fate(run)
        parts.append(f"{run.job_id} {run.stop_fate} ({why})")
        fates[run.job_id] = run.stop_fate
    logger.info("stopping: %s", f"{len(parts)} job(s): " + ", ".join(parts) if parts
                else "no job held", extra={"action": "worker_stop", "jobs": fates})


def confirm(run: JobRun, done: str) -> None:
    """`run` is being reported as `done` (COMPLETING or FAILING): if the stop line said
    otherwise (its model exited just after it), log what goes out instead."""
    if run.stop_fate is not None and run.stop_fate != done:
        logger.info("job %s: %s after all, not %s (its model exited as the worker stopped)",
                    run.job_id, done, run.stop_fate,
                    extra={"action": "worker_stop_fate", "job_id": run.job_id, "fate": done})
        run.stop_fate = done
