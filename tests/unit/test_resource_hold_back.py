"""A big GPU job is not starved by a stream of smaller lower-priority ones: once it waits
for resources this worker's running jobs hold, the claim keeps that capacity from lower
priorities; they backfill only what it cannot use. FakeClock, real SQLite."""

from __future__ import annotations

from coordd.wire.protocol import Complete, Heartbeat, JobId
from tests.conftest import COOL


def gpu(index, total, used):
    return {"index": index, "memory_total_mb": total, "memory_used_mb": used}


async def beat(bundle, *devices):
    await bundle.coord.heartbeat(Heartbeat(worker_id="w1", roles=["gpu"], readings={
        **COOL, "gpu_devices": list(devices)}))


async def complete(bundle, claimed):
    await bundle.coord.complete(Complete(job_id=claimed.job.job_id, worker_id="w1",
                                         token=claimed.lease.token, result={}))


async def enqueue(bundle, prio, vram_mb):
    return await bundle.enqueue(priority=prio, role="gpu", resources={"vram_mb": vram_mb})


async def test_a_60_gb_p1_job_runs_despite_a_steady_stream_of_30_gb_p2_jobs(bundle):
    await beat(bundle, gpu(0, 80000, 0))
    small = {await enqueue(bundle, 2, 30000), await enqueue(bundle, 2, 30000)}
    running = [await bundle.claim("w1"), await bundle.claim("w1")]
    assert {r.job.job_id for r in running} == small
    big = await enqueue(bundle, 1, 60000)
    for _ in range(2):
        small.add(await enqueue(bundle, 2, 30000))  # the stream goes on
    order = []
    for _ in range(4):  # each round one running job ends and the live reading follows
        bundle.clock.advance(5)
        done = running.pop(0)
        await complete(bundle, done)
        await beat(bundle, gpu(0, 80000, sum(
            60000 if r.job.job_id == big else 30000 for r in running)))
        got = await bundle.claim("w1")
        order.append(got.job and got.job.job_id)
        if got.job is None:
            assert got.detail == "vram: need 60000 MiB, 50000 free on gpu0"
        else:
            running.append(got)
    # round 1: the freed 30 GB stays free for the P1; round 2: it runs; then the stream
    assert order[:2] == [None, big]
    assert set(order[2:]) <= small and None not in order[2:]


async def test_lower_priorities_backfill_only_what_the_waiting_job_cannot_use(bundle):
    await beat(bundle, gpu(0, 80000, 0), gpu(1, 40000, 0))
    first = await enqueue(bundle, 2, 30000)
    held = await bundle.claim("w1")
    assert held.job.job_id == first and held.job.gpu_ids == [1]  # best fit: the small GPU
    await enqueue(bundle, 2, 30000)
    second = await bundle.claim("w1")
    assert second.job.gpu_ids == [0]
    await beat(bundle, gpu(0, 80000, 30000), gpu(1, 40000, 30000))
    big = await enqueue(bundle, 1, 60000)  # fits gpu0 only, once `second` ends there
    await complete(bundle, held)  # gpu1 frees: the P1 cannot use it
    await beat(bundle, gpu(0, 80000, 30000), gpu(1, 40000, 0))
    third = await enqueue(bundle, 2, 30000)
    got = await bundle.claim("w1")
    assert got.job.job_id == third and got.job.gpu_ids == [1]  # backfilled beside it
    fourth = await enqueue(bundle, 2, 10000)
    got = await bundle.claim("w1")
    assert got.job.job_id == fourth and got.job.gpu_ids == [1]  # gpu1's last 10 GB
    fifth = await enqueue(bundle, 2, 10000)  # gpu0 shows 50 GB free: held for the P1
    refused = await bundle.claim("w1")
    assert refused.job is None and refused.detail == "vram: need 60000 MiB, 50000 free on " \
        "gpu0 (0 of 2 GPUs fit, need 1)"
    view = await bundle.coord.get_job(JobId(job_id=fifth))
    assert view.status == "waiting"
    await complete(bundle, second)
    await beat(bundle, gpu(0, 80000, 0), gpu(1, 40000, 40000))
    got = await bundle.claim("w1")
    assert got.job.job_id == big and got.job.gpu_ids == [0]
    got = await bundle.claim("w1")
    assert got.job.job_id == fifth and got.job.gpu_ids == [0]  # beside the P1 now


async def test_a_job_waiting_for_another_programs_vram_holds_nothing_back(bundle):
    await beat(bundle, gpu(0, 80000, 0))
    mine = await enqueue(bundle, 2, 10000)
    assert (await bundle.claim("w1")).job.job_id == mine
    await beat(bundle, gpu(0, 80000, 10000 + 40000))  # another program takes 40 GB
    await enqueue(bundle, 1, 60000)  # would not fit even once `mine` ends
    small = await enqueue(bundle, 2, 10000)
    got = await bundle.claim("w1")
    assert got.job is not None and got.job.job_id == small
