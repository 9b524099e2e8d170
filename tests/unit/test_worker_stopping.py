"""worker.stopping: the stop line's fate of each held job, read from the job's state, and
the correction logged when a model exits between the line and its kill."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from coordd.wire.protocol import ClaimedJob
from worker import stopping
from worker.jobrun import CANCELLED, SHUTDOWN, TIMEOUT, JobRun


def _run(job_id: str = "j1", rc: int | None = None, killed: bool = False,
         started: bool = True, reason: str | None = None, lease_gone: bool = False) -> JobRun:
    run = JobRun(job=ClaimedJob(job_id=job_id, kind="m", required_role="cpu", priority=1,
                                payload={}, attempts=1),
                 token=1, deadline=1e9, dir="/nonexistent", kind=None)
    if started:
        run.proc = SimpleNamespace(returncode=rc, killed_by_us=killed)  # type: ignore[assignment]
    if reason is not None:
        run.abort(reason)
    run.lease_gone = lease_gone
    return run


@pytest.mark.parametrize("run,fate,why", [
    (_run(rc=0), stopping.COMPLETING, "its model exited 0"),
    (_run(rc=3), stopping.FAILING, "its model exited 3"),
    (_run(rc=75), stopping.FAILING, "its model exited 75"),
    (_run(rc=-9), stopping.FAILING, "its model was killed by SIGKILL"),
    (_run(), stopping.HANDING_BACK, "its model is running"),
    (_run(started=False), stopping.HANDING_BACK, "its model has not started"),
    (_run(rc=-15, killed=True, reason=TIMEOUT), stopping.FAILING, "timed out"),
    (_run(reason=CANCELLED), stopping.FAILING, "cancelled"),
    (_run(rc=-15, killed=True, reason="vacate: preempted by j9"), stopping.HANDING_BACK,
     "vacate: preempted by j9"),
    (_run(rc=0, lease_gone=True), stopping.DROPPING, "its lease is gone"),
], ids=["exit0", "exit3", "exit75", "signal", "running", "not_started", "timeout",
        "cancelled", "vacate", "lease_gone"])
def test_fate_reads_the_jobs_state(run, fate, why):
    got, reason = stopping.fate(run)
    assert got == fate and why in reason


def test_announce_names_each_job_and_confirm_corrects_a_late_exit(caplog):
    runs = [_run("a", rc=0), _run("b")]
    with caplog.at_level(logging.INFO, logger="worker.supervisor"):
        stopping.announce(runs)
        stopping.confirm(runs[0], stopping.COMPLETING)  # as announced: no line
        runs[1].abort(SHUTDOWN)
        stopping.confirm(runs[1], stopping.COMPLETING)  # exited before its kill
        stopping.announce([])
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "stopping: 2 job(s): a completing (its model exited 0), "
        "b handing back (its model is running)",
        "job b: completing after all, not handing back (its model exited as the worker "
        "stopped)",
        "stopping: no job held"], lines
    assert caplog.records[0].jobs == {"a": "completing", "b": "handing back"}


def test_a_cancel_request_is_logged_with_its_job(caplog):
    """The plain log line names the job (a worker with slots runs several at once)."""
    caplog.set_level(logging.INFO, logger="worker.supervisor")
    run = _run(job_id="j7")
    run.request_cancel()
    run.request_cancel()  # once
    assert [r.getMessage() for r in caplog.records] == ["job j7: cancel requested"]
