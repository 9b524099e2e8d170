"""Issue 31 item 8: `status` names the oldest due waiting jobs with why each waits, and
warns when a P0 job (a user waiting) has waited longer than `warn_p0_wait_s`. Pinned
clock: two P0 jobs wait 20 minutes, one of a kind no live worker runs, one asking for a
GPU no worker has; neither is in `status` at first, both are after 20 minutes."""

from __future__ import annotations

import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.service import waiting_report
from coordd.wire.protocol import Heartbeat, JobView
from tests.conftest import COOL


async def test_two_p0_jobs_waiting_20_minutes_are_named_with_their_reasons(make_bundle):
    bundle = await make_bundle()
    await bundle.coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu", "gpu"],
                                           readings=COOL, kinds=["embed"]))
    p3 = await bundle.enqueue(priority=3, kind="embed")  # runnable: waits for a claim
    train = await bundle.enqueue(priority=0, kind="train")
    bundle.clock.advance(1)
    gpu = await bundle.enqueue(priority=0, role="gpu", kind="embed", resources={"gpus": 1})
    st = await bundle.coord.status()
    assert [(w.job_id, w.priority) for w in st.waiting] == [(train, 0), (gpu, 0), (p3, 3)]
    assert st.waiting[0].waited_s == 1.0 and st.waiting[1].waited_s == 0.0
    assert not [w for w in st.warnings if "P0" in w]
    bundle.clock.advance(20 * 60)
    await bundle.coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu", "gpu"],
                                           readings=COOL, kinds=["embed"]))
    st = await bundle.coord.status()
    by_id = {w.job_id: w for w in st.waiting}
    assert by_id[train].waited_s == 1201.0 and by_id[gpu].waited_s == 1200.0
    assert by_id[train].reason == "no live worker runs kind train"
    assert by_id[gpu].reason.startswith("waiting for resources: gpus")
    assert by_id[p3].reason == "runnable: waiting for a worker to claim it"
    (late,) = [w for w in st.warnings if "P0" in w]
    assert late.startswith("2 P0 job(s) waiting longer than warn_p0_wait_s (300s): "
                           f"{train} (train) 1201s: {by_id[train].reason}; "
                           f"{gpu} (embed) 1200s: {by_id[gpu].reason}")


async def test_warn_p0_wait_s_is_configurable_and_checked(make_bundle):
    bundle = await make_bundle(warn_p0_wait_s=3600.0)
    await bundle.enqueue(priority=0, kind="train")
    bundle.clock.advance(20 * 60)
    st = await bundle.coord.status()
    assert len(st.waiting) == 1 and not [w for w in st.warnings if "P0" in w]
    off = await make_bundle(warn_p0_wait_s=0)
    await off.enqueue(priority=0, kind="train")
    off.clock.advance(86400)
    assert not [w for w in (await off.coord.status()).warnings if "P0" in w]
    for bad, said in ((-1, "must be a finite number >= 0"), (float("nan"), "finite"),
                      ("10m", "Expected `float`, got `str`")):
        with pytest.raises(errors.ConfigError, match="warn_p0_wait_s") as got:
            config_mod.load(None, warn_p0_wait_s=bad)
        assert said in str(got.value)


def test_report_shows_p0_first_then_oldest_and_only_due_p0_warns():
    def view(job_id: str, prio: int, reason: str) -> JobView:
        return JobView(job_id=job_id, kind="k", required_role="cpu", priority=prio,
                       effective_priority=prio, status="waiting", attempts=0, max_attempts=3,
                       run_at=0.0, created_at=0.0, updated_at=0.0, age_s=0.0,
                       waiting_reason=reason)
    heads = [(900.0, view("c", 2, "x")), (100.0, view("b", 2, "y")),
             (500.0, view("a", 0, "no live worker with role cpu"))]
    shown, warnings = waiting_report.report(heads, 1000.0, 400.0)
    assert [(w.job_id, w.waited_s) for w in shown] == [("a", 500.0), ("b", 900.0),
                                                       ("c", 100.0)]
    assert warnings == ["1 P0 job(s) waiting longer than warn_p0_wait_s (400s): "
                        "a (k) 500s: no live worker with role cpu"]
    assert waiting_report.report(heads, 1000.0, 600.0)[1] == []
