"""Quiet heartbeats (issue 30 item 3, coordd.service.beats): an unchanged beat writes
nothing, governance still reacts on the beat that crosses a threshold, and liveness is
exact: a worker that stops beating is stale when it was before, also across a restart; the
roles a new parked claim is filed under (`roles_of`)."""

from __future__ import annotations

import asyncio
import random

import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.service.coordinator import Coordinator
from coordd.wire.protocol import Heartbeat
from tests.conftest import COOL, T0

KINDS = ["train", "embed", "eval"]

try:  # where the daemon builds it (after issue 27's leftovers); before: a classmethod
    from coordd.daemon.server import sqlite_coordinator as _sqlite_coordinator
except ImportError:
    _sqlite_coordinator = Coordinator.over_sqlite


async def beat(bundle, worker_id="w1", **readings):
    return await bundle.coord.heartbeat(Heartbeat(
        worker_id=worker_id, roles=["cpu"], kinds=KINDS, incarnation="i1",
        readings={**COOL, **readings}))


def batches(bundle):
    return bundle.coord.store.writer.stats.batches


async def stale(bundle, worker_id="w1"):
    c = await bundle.claim(worker_id)
    return "heartbeat_stale" in c.reasons


async def test_an_unchanged_beat_writes_nothing_and_answers_the_same(bundle):
    first = await beat(bundle)
    before = batches(bundle)
    bundle.clock.advance(5)
    again = await beat(bundle, memory_used_pct=41.5, temperature_c=52.0, user_idle_s=3605.0)
    assert batches(bundle) == before  # no writer batch, no statement
    assert bundle.coord.beats.quiet == 1 and bundle.coord.beats.full == 1
    assert again.now == first.now + 5 and again.cancel == [] and again.actions == []


async def test_governance_reacts_on_the_beat_that_crosses_a_threshold(bundle):
    await beat(bundle)
    job = await bundle.enqueue(priority=3, kind="embed")  # P3: suspended on user activity
    c = await bundle.claim("w1", kinds=KINDS)
    assert c.job.job_id == job
    reply = await beat(bundle)  # the claim made the next beat full
    assert [(a.job_id, a.action) for a in reply.actions] == [(job, "continue")]
    bundle.clock.advance(5)
    quiet_before = bundle.coord.beats.quiet
    reply = await beat(bundle, user_idle_s=3000.0, memory_used_pct=60.0)  # no threshold
    assert bundle.coord.beats.quiet == quiet_before + 1
    assert [(a.job_id, a.action) for a in reply.actions] == [(job, "continue")]
    bundle.clock.advance(5)
    before = batches(bundle)
    reply = await beat(bundle, user_idle_s=10.0)  # the user came back: below 300 s
    assert batches(bundle) > before
    assert [(a.job_id, a.action) for a in reply.actions] == [(job, "suspend")]
    bundle.clock.advance(5)
    reply = await beat(bundle, user_idle_s=15.0)  # suspended: every beat decides again
    assert bundle.coord.beats.quiet == quiet_before + 1
    assert reply.actions[0].action == "suspend"


async def test_a_job_gate_of_its_own_counts_as_a_threshold(bundle):
    await beat(bundle)
    job = await bundle.enqueue(priority=2, kind="train",
                               gates={"max_memory_pct": 50.0, "on_close": "suspend"})
    await bundle.claim("w1", kinds=KINDS)
    await beat(bundle)  # full (the claim): its thresholds are learnt
    bundle.clock.advance(5)
    reply = await beat(bundle, memory_used_pct=55.0)  # under the P2 85 %, over the job's 50 %
    assert [(a.job_id, a.action) for a in reply.actions] == [(job, "suspend")]


async def test_a_worker_that_stops_beating_is_stale_when_it_was_before(bundle):
    stale_s = bundle.coord.config.heartbeat_stale_s
    await beat(bundle)
    for _ in range(2):  # two quiet beats, the last at T0 + 10
        bundle.clock.advance(5)
        await beat(bundle)
    assert bundle.coord.beats.quiet == 2
    bundle.clock.advance(2)
    assert await bundle.coord.beats.flush() == 1  # the maintenance round stores T0 + 10
    bundle.clock.set(T0 + 10 + stale_s)
    assert not await stale(bundle)
    bundle.clock.advance(0.5)
    assert await stale(bundle)


async def test_a_quiet_beat_never_leaves_the_stored_time_older_than_fresh_s(bundle):
    t = bundle.coord.beats.timing
    await beat(bundle)
    n = 0
    while bundle.clock.wall() - T0 < t.fresh_s + 5:
        bundle.clock.advance(5)
        await beat(bundle)
        n += 1
    assert bundle.coord.beats.full == 2  # the beat at fresh_s was full again
    assert t.fresh_s + 2 * t.flush_s <= t.stale_s


async def test_a_restart_keeps_liveness_right(make_bundle, tmp_path):
    bundle = await make_bundle()
    stale_s = bundle.coord.config.heartbeat_stale_s
    await beat(bundle)
    bundle.clock.advance(5)
    await beat(bundle)
    bundle.clock.advance(5)
    await beat(bundle)  # quiet beats at T0 + 5 and + 10, never stored: coordd dies
    assert bundle.coord.beats.quiet == 2
    await bundle.coord.push.close()
    await bundle.coord.store.close()  # not Coordinator.close: no flush at shutdown
    bundle.clock.advance(3)  # restart at T0 + 13
    coord = _sqlite_coordinator(bundle.db_path, config_mod.load(None), bundle.clock,
                                rng=random.Random(7))
    await coord.start()
    try:
        assert await coord.beats.restarted() == 1
        bundle.coord = coord
        bundle.clock.set(T0 + 10 + stale_s)  # its real last beat + stale_s: still live
        assert not await stale(bundle)
        bound = coord.beats.timing.fresh_s
        bundle.clock.set(T0 + bound + stale_s + 0.5)  # the grace is bounded: stale now
        assert await stale(bundle)
    finally:
        await coord.close()


async def test_a_cancel_reaches_the_next_beat(bundle):
    await beat(bundle)
    job = await bundle.enqueue(kind="train")
    await bundle.claim("w1", kinds=KINDS)
    await beat(bundle)
    bundle.clock.advance(5)
    await beat(bundle)
    from coordd.wire.protocol import JobId
    await bundle.coord.cancel(JobId(job_id=job))
    reply = await beat(bundle)
    assert reply.cancel == [job]


def test_the_signature_moves_only_when_a_threshold_is_crossed():
    from coordd.rules import governance_beat as gb
    policies = gb.policies_of(config_mod.load(None).policies(), [(2, '{"max_memory_pct": 50}')])
    limits = gb.thresholds(policies)
    sig = gb.signature(limits, COOL)
    assert gb.signature(limits, {**COOL, "memory_used_pct": 49.0, "temperature_c": 70.0}) == sig
    for crossed in ({"memory_used_pct": 50.5}, {"temperature_c": 96.0},  # job's 50 %; critical
                    {"user_idle_s": 10.0}, {"temperature_c": None}, {"memory_used_pct": "x"}):
        assert gb.signature(limits, {**COOL, **crossed}) != sig, crossed
    assert gb.rest({**COOL, "on_battery": True}) != gb.rest(COOL)  # compared exactly
    t = gb.timing(30.0, 5.0)
    assert (t.fresh_s, t.flush_s) == (15.0, 5.0) and t.fresh_s + 2 * t.flush_s <= t.stale_s
    assert gb.timing(10.0, 5.0).fresh_s == 0.0  # rounds too slow for the bound: never quiet


async def test_a_parked_claims_roles_are_unknown_while_a_full_beat_is_stored_or_failed(
        bundle, monkeypatch):
    """Beats.roles_of (a new parked claim's roles, coordd.service.push): the last full
    beat's; unknown while one is being stored, and after one failed (the store may hold its
    roles or not), which also makes the next beat full."""
    beats = bundle.coord.beats
    await beat(bundle)
    assert beats.roles_of("w1") == frozenset({"cpu"}) and beats.roles_of("w2") is None
    storing = asyncio.ensure_future(bundle.coord.heartbeat(Heartbeat(
        worker_id="w1", roles=["gpu"], kinds=KINDS, incarnation="i1", readings=COOL)))
    await asyncio.sleep(0)  # the beat is on its way to the writer
    assert beats.roles_of("w1") is None
    await storing
    assert beats.roles_of("w1") == frozenset({"gpu"})

    async def broken(*a, **kw):
        raise errors.Unavailable("the store is gone")
    monkeypatch.setattr(bundle.coord.store, "heartbeat_governed", broken)
    with pytest.raises(errors.Unavailable):
        await bundle.coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu"], kinds=KINDS,
                                               incarnation="i1", readings=COOL))
    assert beats.roles_of("w1") is None
    monkeypatch.undo()
    full = beats.full
    await bundle.coord.heartbeat(Heartbeat(worker_id="w1", roles=["gpu"], kinds=KINDS,
                                           incarnation="i1", readings=COOL))
    assert beats.full == full + 1 and beats.roles_of("w1") == frozenset({"gpu"})
