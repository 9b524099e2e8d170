"""Overload by class (issue 21, finding 8): with the writer's new-work lane full, holder
calls and coordd's own maintenance are still admitted, and committed first."""

from __future__ import annotations

import asyncio

import pytest

from coordd import errors
from coordd.wire.protocol import Checkpoint, Complete, Renew
from coordd.service.reaper import Reaper
from coordd.store.sqlite.writer import Writer

QUEUE_MAX = 8


def _fill_new_work_lane(writer: Writer) -> list[asyncio.Future]:
    futs = [writer.submit(lambda conn, now: None) for _ in range(QUEUE_MAX)]
    with pytest.raises(errors.Overloaded):
        writer.submit(lambda conn, now: None)
    return futs


async def test_holder_calls_admitted_while_new_work_is_refused(make_bundle):
    b = await make_bundle(writer_queue_max=QUEUE_MAX)
    await b.worker("w1")
    job = await b.enqueue()
    other = await b.enqueue()
    lease = (await b.claim("w1")).lease
    lease2 = (await b.claim("w1")).lease
    flood = _fill_new_work_lane(b.coord.store.writer)
    with pytest.raises(errors.Overloaded):
        await b.enqueue()
    with pytest.raises(errors.Overloaded):
        await b.claim("w1")
    holder = [
        b.worker("w1"),
        b.coord.renew(Renew(job_id=job, worker_id="w1", token=lease.token, lease_s=30)),
        b.coord.checkpoint(Checkpoint(job_id=job, worker_id="w1", token=lease.token,
                                      checkpoint={"step": 1})),
        b.coord.complete(Complete(job_id=other, worker_id="w1", token=lease2.token,
                                  result={"ok": True})),
    ]
    results = await asyncio.gather(*holder, return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException)], results
    await asyncio.gather(*flood)


async def test_urgent_lane_committed_before_queued_new_work(make_bundle):
    b = await make_bundle(writer_queue_max=QUEUE_MAX)
    order: list[str] = []
    w = b.coord.store.writer
    new = [w.submit(lambda conn, now, i=i: order.append(f"new{i}")) for i in range(3)]
    urgent = w.submit(lambda conn, now: order.append("urgent"), urgent=True)
    await asyncio.gather(*new, urgent)
    assert order[0] == "urgent", order


async def test_reaper_round_not_skipped_under_an_enqueue_flood(make_bundle, caplog):
    b = await make_bundle(writer_queue_max=QUEUE_MAX)
    await b.worker("w1")
    await b.enqueue()
    await b.claim("w1", lease_s=5)
    b.clock.advance(6)
    reaper = Reaper(b.coord, b.clock, interval=1.0, prune_interval=1.0)
    flood = _fill_new_work_lane(b.coord.store.writer)
    assert await reaper.round() == []
    assert (await b.coord.status()).jobs["waiting"] == 1  # the expired lease was reaped
    assert "skipped" not in caplog.text
    await asyncio.gather(*flood)


async def test_urgent_lane_has_its_own_bound(make_bundle):
    b = await make_bundle(writer_queue_max=QUEUE_MAX)
    w = b.coord.store.writer
    futs = [w.submit(lambda conn, now: None, urgent=True) for _ in range(QUEUE_MAX)]
    with pytest.raises(errors.Overloaded, match="holder and maintenance"):
        w.submit(lambda conn, now: None, urgent=True)
    with b.coord.store.maintenance_window():
        with pytest.raises(errors.Overloaded):
            w.submit(lambda conn, now: None)
    futs.append(w.submit(lambda conn, now: None))  # new work: the other lane
    await asyncio.gather(*futs)
