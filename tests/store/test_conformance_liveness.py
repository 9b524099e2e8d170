"""The quiet heartbeats' statements on both stores (coordd.store.api_governance
`touch_workers`, `liveness_grace`, and `held` of a governed heartbeat)."""

from __future__ import annotations

from coordd import config as config_mod
from coordd.service import governor
from coordd.store.api_governance import Governance, WorkerBeat
from tests.conftest import COOL, T0


def gov() -> Governance:
    cfg = config_mod.load(None)
    return Governance(policies=cfg.policies(), preemptor=governor.preemptor(cfg))


async def beat(bundle, g, worker_id, now):
    return await bundle.store.heartbeat_governed(worker_id, ["cpu"], COOL, WorkerBeat(), g,
                                                 now=now)


async def seen(bundle, now):
    book = await bundle.store.worker_book(now=now)
    return {row[0]: row[3] for row in book.rows}


async def test_touch_workers_stores_the_batch_and_never_goes_back(bundle):
    g = gov()
    for w in ("w1", "w2", "w3"):
        await beat(bundle, g, w, T0)
    await beat(bundle, g, "w3", T0 + 9)
    preempted = await bundle.store.touch_workers(
        [("w1", 2.0, None), ("w3", 4.0, None), ("gone", 1.0, None)], g, now=T0 + 10)
    assert preempted == []
    assert await seen(bundle, T0 + 10) == {"w1": T0 + 8, "w2": T0, "w3": T0 + 9}
    await bundle.store.touch_workers([], g, now=T0 + 11)  # an empty batch is fine


async def test_touch_workers_stores_a_quiet_beats_readings_where_given(bundle):
    """The views show what a quiet beat reported, one flush later; None keeps the stored."""
    g = gov()
    for w in ("w1", "w2"):
        await beat(bundle, g, w, T0)
    await bundle.store.touch_workers(
        [("w1", 1.0, {**COOL, "memory_used_pct": 33.0}), ("w2", 1.0, None)], g, now=T0 + 5)
    book = await bundle.store.worker_book(now=T0 + 5)
    readings = {row[0]: row[2] for row in book.rows}
    assert readings["w1"]["memory_used_pct"] == 33.0
    assert readings["w2"] == COOL


async def test_liveness_grace_covers_what_a_stopped_coordd_had_not_stored(bundle):
    g = gov()
    await beat(bundle, g, "live", T0)
    await beat(bundle, g, "recent", T0 + 95)
    await beat(bundle, g, "long_gone", T0 - 100)
    await beat(bundle, g, "left", T0)
    await bundle.store.goodbye("left", None, now=T0 + 1)
    n = await bundle.store.liveness_grace(15.0, 30.0, now=T0 + 100)  # bound 15, stale 30
    assert n == 1
    assert await seen(bundle, T0 + 100) == {
        "live": T0,  # T0 + 15 + 30 < T0 + 100: stale whatever it did after T0: unmoved
        "recent": T0 + 100,  # min(now, T0 + 95 + 15)
        "long_gone": T0 - 100, "left": T0}
    await beat(bundle, g, "mid", T0 + 60)
    await bundle.store.liveness_grace(15.0, 30.0, now=T0 + 100)
    assert (await seen(bundle, T0 + 100))["mid"] == T0 + 75


async def test_a_governed_heartbeat_names_the_held_jobs_gates(bundle):
    g = gov()
    await beat(bundle, g, "w1", T0)
    job = bundle.job(priority=3)
    job.gates_json = '{"max_memory_pct": 50.0}'
    await bundle.store.enqueue([job], now=T0)
    c = await bundle.claim("w1", T0 + 1)
    assert c.job is not None
    got = await beat(bundle, g, "w1", T0 + 2)
    assert got.held == [(3, '{"max_memory_pct": 50.0}')]


async def test_an_unchanged_beat_calls_no_store_and_a_crossing_one_does(bundle):
    """The Coordinator over either store: one full beat, then beats that cross nothing
    reach no store method; the one that crosses a threshold is recorded with its action."""
    from coordd.clock import FakeClock
    from coordd.service.coordinator import Coordinator
    from coordd.wire.protocol import Claim, Enqueue, Heartbeat

    clock = FakeClock(T0)
    coord = Coordinator(bundle.store, config_mod.load(None), clock)
    calls: list[str] = []
    for name in ("heartbeat_governed", "touch_workers"):
        real = getattr(bundle.store, name)

        async def counted(*a, _real=real, _name=name, **kw):
            calls.append(_name)
            return await _real(*a, **kw)
        setattr(bundle.store, name, counted)

    def hb(**readings):
        return coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu"], kinds=["a", "b"],
                                         readings={**COOL, **readings}))
    await hb()
    await coord.enqueue(Enqueue(kind="a", required_role="cpu", priority=3, payload={}))
    job = (await coord.claim(Claim(worker_id="w1", kinds=["a", "b"]))).job
    await hb()
    calls.clear()
    for i in range(5):
        clock.advance(1)
        reply = await hb(memory_used_pct=40.0 + i, user_idle_s=3000.0 + i)
        assert [(a.job_id, a.action) for a in reply.actions] == [(job.job_id, "continue")]
    assert calls == []
    assert await coord.beats.flush() == 1 and calls == ["touch_workers"]  # one batch
    clock.advance(1)
    reply = await hb(user_idle_s=5.0)  # P3 needs 300 s idle: suspended on this beat
    assert calls == ["touch_workers", "heartbeat_governed"]
    assert [(a.job_id, a.action) for a in reply.actions] == [(job.job_id, "suspend")]
