"""Crash hygiene of coord-worker (issue 14), with real processes: a SIGKILLed worker leaves
no model running and its restart gets the job back at once; a kind whose command cannot
start is set aside without spending attempts; a stopped worker is offline at once; a
coordd that is down is logged once, not per call."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time

import psutil

from tests.integration.workerbench import alive, bench  # noqa: F401 - the fixture

# Writes a new checkpoint file every 0.1 s for a minute.
CHECKPOINTER = textwrap.dedent("""
    import os, time
    d = os.environ["COORD_CHECKPOINT_DIR"]
    for i in range(600):
        tmp = os.path.join(d, ".tmp")
        with open(tmp, "w") as fh:
            fh.write(str(i))
        os.replace(tmp, os.path.join(d, "ckpt-%04d" % i))
        time.sleep(0.1)
""")


def group_members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.Error):
            pass
    return out


async def test_sigkilled_worker_leaves_no_model_and_restart_gets_job_back_at_once(bench):
    w = bench.start_worker(lease_s=60)  # expiry would take a minute
    job = await bench.enqueue({"sleep": 60, "child": True}, max_attempts=3)
    leader, helper = await bench.model_pids(job, "w1")
    assert os.getpgid(helper) == leader
    w.proc.kill()  # no goodbye, no clean-up
    w.proc.wait(5)
    await bench.until(lambda: _async(not alive([leader])), timeout=5,
                      what="model leader killed by the parent-death signal")
    assert alive([helper]) == [helper]  # a helper of the group outlives the leader...
    t0 = time.monotonic()
    w2 = bench.start_worker(lease_s=60)  # ...until the same worker id starts again
    await bench.until(lambda: _async(not group_members(leader)), timeout=10,
                      what="the dead worker's model group killed")

    async def reclaimed():
        v = await bench.client.get_job(job)
        return v if v.status == "running" and v.attempts == 2 else None
    view = await bench.until(reclaimed, timeout=10, what="job claimed again")
    assert time.monotonic() - t0 < 10, w2.log()  # not at the lease's end (60 s)
    reasons = [e.reason for e in view.events]
    assert "worker_lost" in reasons and reasons.count("lease_expired") == 0
    assert view.lease.worker_id == "w1"
    assert "killing 2 process(es) of model group" not in w2.log()  # the leader was gone
    assert "killing 1 process(es) of model group" in w2.log()


async def test_broken_kinds_are_not_claimed_and_a_failed_spawn_spends_no_attempt(bench):
    garbage = bench.tmp / "not-a-program"
    garbage.write_bytes(b"\x7fELF garbage")  # executable, passes the start check, exec fails
    garbage.chmod(0o755)
    w = bench.start_worker(extra_kinds={"missing": {"argv": ["/nonexistent/model"]},
                                        "garbled": {"argv": [str(garbage)]}})
    missing = await bench.enqueue({}, kind="missing", max_attempts=1)
    garbled = [await bench.enqueue({}, kind="garbled", max_attempts=1) for _ in range(3)]
    ok = await bench.enqueue({"echo": 1})
    assert (await bench.status_is(ok, "succeeded")).result["echo"] == 1

    async def both_broken():
        ws = (await bench.client.workers()).workers
        return ws[0] if ws and set(ws[0].broken_kinds) == {"missing", "garbled"} else None
    seen = await bench.until(both_broken, what="both kinds reported broken")
    assert seen.kinds == ["m"] and "no such file" in seen.broken_kinds["missing"]
    assert "Exec format error" in seen.broken_kinds["garbled"], w.log()
    await asyncio.sleep(1.0)  # claim rounds every 0.1 s: none of them may take these jobs
    views = [await bench.client.get_job(j) for j in [missing, *garbled]]
    assert [v.status for v in views] == ["waiting"] * 4, w.log()
    assert [v.attempts for v in views] == [0] * 4
    # one spawn failed; jobs claimed beside it (at most the worker's slots) went back too
    assert views[0].preemptions == 0 and all(v.preemptions <= 1 for v in views)
    reasons = [e.reason for v in views for e in v.events]
    assert sum(r.startswith("released: spawn_failed") for r in reasons) == 1
    await asyncio.sleep(1.0)  # and then no hot loop: nothing more is claimed
    again = [await bench.client.get_job(j) for j in [missing, *garbled]]
    assert [v.preemptions for v in again] == [v.preemptions for v in views]
    assert views[0].waiting_reason.startswith("no live worker runs kind missing (broken on w1")
    assert "kind missing is not usable" in w.log()
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0
    [gone] = (await bench.client.workers()).workers  # offline at once: a goodbye
    assert gone.live is False and gone.offline_at is not None
    assert (await bench.client.status()).workers_live == 0


async def test_unreachable_coordd_is_logged_once_and_backed_off(bench):
    model = bench.tmp / "ckpt.py"
    model.write_text(CHECKPOINTER)
    w = bench.start_worker(extra_kinds={"c": {"argv": [sys.executable, str(model)]}},
                           lease_s=30)
    job = await bench.enqueue({}, kind="c")

    async def checkpointed():
        return (await bench.client.get_job(job)).checkpoint
    await bench.until(checkpointed, what="a checkpoint recorded")
    bench.daemon.kill()
    await asyncio.sleep(3.0)  # a new checkpoint file every 0.1 s, polled every 0.5 s
    log = w.log()
    assert log.count("coordd unreachable") == 1, log
    assert "checkpoint not recorded" not in log
    assert w.proc.poll() is None


async def _async(value):
    return value
