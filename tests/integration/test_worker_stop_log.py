"""coord-worker's stop line says what happens to each job it holds: `completing` when the
model has exited 0 and its result is on its way, `failing` when it exited non-zero,
`handing back` when it is still running (killed, released). Real coordd, a real worker
process, its log read back; coordd is held with SIGSTOP so the report is still in flight
when the worker is told to stop."""

from __future__ import annotations

import asyncio
import re
import signal
import time

import pytest

from tests.integration.workerbench import alive, bench  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)


def _stop_line(log: str) -> str:
    got = [ln for ln in log.splitlines() if "stopping:" in ln]
    assert len(got) == 1, log
    return got[0]


async def _until_dead(pids: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pids):
        assert time.monotonic() < deadline, f"model {pids} still alive"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("exit_code,fate,status", [
    (0, "completing (its model exited 0)", "succeeded"),
    (3, "failing (its model exited 3)", "failed"),
], ids=["completing", "failing"])
async def test_stop_with_a_report_in_flight_says_what_goes_out(bench, exit_code, fate,  # noqa: F811
                                                               status):
    w = bench.start_worker(lease_s=30, grace_s=0.5, stop_timeout_s=8)
    job = await bench.enqueue({"sleep": 0.5, "exit": exit_code}, max_attempts=1)
    pids = await bench.model_pids(job, "w1")
    coordd = bench.daemon.proc
    coordd.send_signal(signal.SIGSTOP)  # the worker's report waits for an answer
    try:
        await _until_dead(pids)
        await asyncio.sleep(0.3)  # the worker saw the exit and sent its report
        w.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
    finally:
        coordd.send_signal(signal.SIGCONT)
    assert w.proc.wait(15) == 0, w.log()
    line = _stop_line(w.log())
    assert f"{job} {fate}" in line and "handing back" not in line, line
    assert (await bench.status_is(job, status)).status == status


async def test_stop_while_the_model_runs_says_handing_back(bench):  # noqa: F811
    w = bench.start_worker(lease_s=30, grace_s=0.5)
    jobs = [await bench.enqueue({"sleep": 60})]
    await bench.model_pids(jobs[0], "w1")
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0, w.log()
    log = w.log()
    line = _stop_line(log)
    assert re.search(rf"1 job\(s\): {jobs[0]} handing back \(its model is running\)", line), line
    assert f"job {jobs[0]}: handed back (worker_shutdown)" in log, log
