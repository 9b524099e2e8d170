"""What each long-running program does with the signals operators and systemd send: real
processes, real signals, their log output read back.

coordd and coord-worker handle SIGHUP (systemctl reload, logrotate) and keep running;
a graceful stop of a worker logs the stop and its hand-backs, never "coordd unreachable".
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from tests.integration.test_worker import bench  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)


async def _log_has(read, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in (got := read()):
        assert time.monotonic() < deadline, f"{text!r} not logged in {timeout}s: {got[-2000:]}"
        await asyncio.sleep(0.05)
    return got


@pytest.mark.parametrize("holding", [True, False], ids=["holding_a_job", "idle"])
async def test_graceful_worker_stop_logs_the_stop_not_coordd_unreachable(bench, holding):  # noqa: F811
    w = bench.start_worker(lease_s=30, grace_s=0.5, claim_interval_s=0.2)
    await _log_has(w.log, "started")
    job = None
    if holding:
        job = await bench.enqueue({"sleep": 60})
        await bench.model_pids(job, "w1")
    else:
        await asyncio.sleep(0.5)  # its claim parked at coordd
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0
    log = w.log()
    assert "stopping: handing back" in log and "stopped" in log, log
    assert "unreachable" not in log and "WARNING coordd" not in log, log
    assert "ERROR" not in log and "Traceback" not in log, log
    if job is not None:
        assert f"job {job}: handed back (worker_shutdown)" in log, log
        view = await bench.client.get_job(job)
        assert view.status == "waiting" and view.last_error == "released: worker_shutdown"


async def test_a_call_cut_short_by_our_own_close_is_not_an_outage(daemon):
    """Client.close() fails its calls in flight with Closed, which worker.link ignores; a
    connection coordd drops is still Disconnected (an outage)."""
    from coordd.client import Client, Closed, Disconnected
    from worker.link import Link
    client = Client(daemon.socket, timeout=10)
    parked = asyncio.ensure_future(client.claim("w9", 30, "c1", wait_s=5))
    await asyncio.sleep(0.3)
    await client.close()
    with pytest.raises(Closed) as got:
        await parked
    link = Link()
    link.failed(got.value)
    assert not link.down
    link.failed(Disconnected("coordd closed the connection"))
    assert link.down
