"""Issue 31 item 8 over both stores: the oldest due waiting jobs of each priority
(`oldest_waiting`) and `status`'s waiting list and late-P0 warning built on them
(coordd.service.waiting_report.on_store, as the Coordinator over the store interface runs it).
`now` pinned: two P0 jobs wait 20 minutes, one of a kind no live worker runs, one for a
role no live worker has."""

from __future__ import annotations

from coordd import config as config_mod
from coordd.service import waiting_report
from coordd.store.api_governance import WorkerBeat
from tests.store.conftest import COOL, T0
from tests.store.test_conformance_governance import gov


async def test_two_p0_jobs_waiting_20_minutes_are_listed_and_warned_of(bundle):
    g = gov()
    cfg = config_mod.load(None)
    await bundle.store.heartbeat_governed("w1", ["cpu"], COOL,
                                          WorkerBeat(kinds_json='["embed"]'), g, now=T0)
    old3 = await bundle.enqueue(priority=3, kind="embed")
    train = await bundle.enqueue(now=T0 + 1, priority=0, kind="train")
    gpu = await bundle.enqueue(now=T0 + 2, priority=0, role="gpu", kind="embed")
    later = await bundle.enqueue(now=T0 + 3, priority=3, kind="embed", run_at=T0 + 9999)
    t, heads = await bundle.store.oldest_waiting([0, 3], 3, now=T0 + 10)
    assert t == T0 + 10 and later not in [j.job_id for _, j in heads]  # not due
    assert sorted((ready, j.job_id) for ready, j in heads) == [
        (T0, old3), (T0 + 1, train), (T0 + 2, gpu)]
    assert (await bundle.store.oldest_waiting([0], 1, now=T0 + 10))[1][0][1].job_id == train

    by_prio = (await bundle.store.status(30.0, now=T0 + 10)).waiting_by_priority
    shown, late = await waiting_report.on_store(bundle.store, by_prio, g.policies, 30.0,
                                                cfg.warn_p0_wait_s, now=T0 + 10)
    assert [(w.job_id, w.waited_s) for w in shown] == [(train, 9.0), (gpu, 8.0), (old3, 10.0)]
    assert late == []
    await bundle.store.heartbeat_governed("w1", ["cpu"], COOL,
                                          WorkerBeat(kinds_json='["embed"]'), g, now=T0 + 1200)
    shown, late = await waiting_report.on_store(bundle.store, by_prio, g.policies, 30.0,
                                                cfg.warn_p0_wait_s, now=T0 + 1202)
    assert [(w.job_id, w.waited_s, w.reason) for w in shown] == [
        (train, 1201.0, "no live worker runs kind train"),
        (gpu, 1200.0, "no live worker with role gpu"),
        (old3, 1202.0, "runnable: waiting for a worker to claim it")]
    assert late == [f"2 P0 job(s) waiting longer than warn_p0_wait_s (300s): {train} (train) "
                    f"1201s: no live worker runs kind train; {gpu} (embed) 1200s: no live "
                    "worker with role gpu"]
