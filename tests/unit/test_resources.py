"""Resource admission (issue 16, item 3): GPUs, VRAM and RAM requests against what a
worker advertises, less what its leases hold; the GPU temperature gate. Pinned clock,
real SQLite."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.rules import resources
from coordd.wire.protocol import Heartbeat, JobId, ListJobs
from coordd.wire.workers import Goodbye
from coordd.rules.resources import Grant, Request
from tests.conftest import COOL

def gpu(index, total, used, temp=50.0):
    return {"index": index, "memory_total_mb": total, "memory_used_mb": used,
            "gpu_temperature_c": temp, "utilization_pct": 0.0}


def box(*gpus, ram_mb=16000, **extra):
    return {"gpus": len(gpus), "gpu_devices": list(gpus), "ram_mb": ram_mb, **extra}


async def beat(bundle, worker_id="w1", **readings):
    return await bundle.coord.heartbeat(Heartbeat(worker_id=worker_id, roles=["cpu"],
                                                  readings={**COOL, **readings}))


# ---------------------------------------------------------------- the arithmetic (pure)


def test_fit_subtracts_held_grants_and_respects_the_live_reading():
    r = box(gpu(0, 16000, 1000), gpu(1, 16000, 12900))
    need = Request(gpus=1, vram_mb=8000)
    got = resources.fit(r, need, [])
    assert got == Grant(gpu_ids=(0,), vram_mb=8000)  # gpu1 shows only 3100 free live
    held = [Grant(gpu_ids=(0,), vram_mb=9000)]
    assert resources.fit(r, need, held) == "vram: need 8000 MiB, 7000 free on gpu0 " \
                                           "(0 of 2 GPUs fit, need 1)"
    one = box(gpu(1, 16000, 12900))
    assert resources.fit(one, need, []) == "vram: need 8000 MiB, 3100 free on gpu1"
    # best fit: the GPU with the least room that still fits
    r2 = box(gpu(0, 24000, 0), gpu(1, 16000, 0))
    assert resources.fit(r2, need, []).gpu_ids == (1,)


def test_whole_gpus_ram_and_a_worker_without_gpus():
    r = box(gpu(0, 16000, 0), gpu(1, 16000, 0), ram_mb=4000)
    assert resources.fit(r, Request(gpus=2), []) == Grant(gpu_ids=(0, 1))
    held = [Grant(gpu_ids=(1,), vram_mb=100)]
    assert resources.fit(r, Request(gpus=2), held) == "gpus: need 2 whole, 1 of 2 free"
    assert resources.fit(r, Request(gpus=1, vram_mb=100), [Grant(gpu_ids=(0,)),
                                                          Grant(gpu_ids=(1,))]) \
        .startswith("vram: need 100 MiB, 0 free")  # a whole-GPU holder leaves nothing
    assert resources.fit(r, Request(ram_mb=3000), [Grant(ram_mb=2000)]) == \
        "ram: need 3000 MiB, 2000 free of 4000"
    none = {"gpus": 0, "gpu_devices": [], "gpu_reason": "NVML: library not found"}
    assert resources.fit(none, Request(gpus=1), []) == \
        "gpus: need 1, the worker has 0 (NVML: library not found)"
    assert resources.fit({}, Request(ram_mb=1), []).startswith("ram: need 1 MiB, the worker")


@pytest.mark.parametrize("value,message", [
    ({"vram": 1}, "resources: unknown key 'vram'"),
    ({"gpus": -1}, "resources.gpus must be 0..64, got -1"),
    ({"vram_mb": 1 << 30}, "resources.vram_mb must be 0..16777216"),
    ({"ram_mb": 1.5}, "resources.ram_mb must be an integer"),
    ({"gpus": True}, "resources.gpus must be an integer"),
    ([1], "resources must be a map"),
])
def test_bad_requests_name_the_field(value, message):
    with pytest.raises(errors.BadRequest, match=message.replace(".", r"\.")
                       .replace("(", r"\(")):
        resources.parse_request(value)


def test_vram_implies_one_gpu_and_an_empty_request_is_none():
    assert resources.parse_request({"vram_mb": 10}) == Request(gpus=1, vram_mb=10)
    assert resources.parse_request({"gpus": 0}) is None


# ---------------------------------------------------------------- claims (coordd)


async def test_enqueue_refuses_a_bad_request_naming_the_field(bundle):
    with pytest.raises(errors.BadRequest, match=r"resources\.vram_mb must be 0\.\."):
        await bundle.enqueue(resources={"gpus": 1, "vram_mb": -5})
    with pytest.raises(errors.BadRequest, match="unknown key 'cpus'"):
        await bundle.enqueue(resources={"cpus": 4})


async def test_a_job_needing_more_vram_than_is_free_waits_with_the_reason(bundle):
    await beat(bundle, **box(gpu(0, 16000, 12900)))
    job = await bundle.enqueue(resources={"gpus": 1, "vram_mb": 8000})
    plain = await bundle.enqueue(priority=3)
    got = await bundle.claim("w1")
    assert got.job.job_id == plain  # the GPU job is skipped, not a head-of-line block
    none = await bundle.claim("w1")
    assert none.job is None and none.reasons == ["resources"]
    assert none.detail == "vram: need 8000 MiB, 3100 free on gpu0"
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.resources == {"gpus": 1, "vram_mb": 8000, "ram_mb": 0}
    assert view.waiting_reason == "waiting for resources: vram: need 8000 MiB; free: 3100 on w1/gpu0"
    listed = (await bundle.coord.list_jobs(ListJobs(status="waiting"))).jobs
    assert [j.waiting_reason for j in listed] == [view.waiting_reason]
    await beat(bundle, **box(gpu(0, 16000, 7000)))  # the other process let go of VRAM
    got = await bundle.claim("w1")
    assert got.job.job_id == job and got.job.gpu_ids == [0]
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.granted == {"gpu_ids": [0], "vram_mb": 8000, "ram_mb": 0}


async def test_two_jobs_whose_requests_exceed_one_gpu_never_hold_it_at_once(bundle):
    await beat(bundle, **box(gpu(0, 16000, 0)))
    a = await bundle.enqueue(resources={"vram_mb": 10000})
    b = await bundle.enqueue(resources={"vram_mb": 10000})
    first = await bundle.claim("w1")
    assert first.job.job_id == a
    refused = await bundle.claim("w1")  # the live reading still says 0 used: arithmetic
    assert refused.job is None and refused.detail == "vram: need 10000 MiB, 6000 free on gpu0"
    w = (await bundle.coord.workers()).workers[0]
    assert w.resources["gpus"][0]["held_mb"] == 10000
    assert w.resources["gpus"][0]["free_mb"] == 6000
    await _complete(bundle, first)
    got = await bundle.claim("w1")
    assert got.job.job_id == b  # the grant ended with a's lease


async def _complete(bundle, claimed):
    from coordd.wire.protocol import Complete
    await bundle.coord.complete(Complete(job_id=claimed.job.job_id, worker_id="w1",
                                         token=claimed.lease.token, result={}))


async def test_ram_requests_add_up_against_the_advertised_ram(bundle):
    await beat(bundle, ram_mb=3000)
    a = await bundle.enqueue(resources={"ram_mb": 2000})
    await bundle.enqueue(resources={"ram_mb": 2000})
    first = await bundle.claim("w1")
    assert first.job.job_id == a and first.job.gpu_ids is None
    refused = await bundle.claim("w1")
    assert refused.detail == "ram: need 2000 MiB, 1000 free of 3000"
    bundle.clock.advance(31)  # the lease lapses: what it held is free again on reap
    await bundle.coord.reap()
    await beat(bundle, ram_mb=3000)
    assert (await bundle.claim("w1")).job is not None


async def test_a_kind_default_in_the_heartbeat_applies_to_jobs_without_a_request(bundle):
    await beat(bundle, **box(gpu(0, 8000, 0)), kind_resources={"embed": {"vram_mb": 6000}})
    e1 = await bundle.enqueue(kind="embed")
    await bundle.enqueue(kind="embed")
    got = await bundle.claim("w1")
    assert got.job.job_id == e1 and got.job.gpu_ids == [0]
    refused = await bundle.claim("w1")
    assert refused.detail == "vram: need 6000 MiB, 2000 free on gpu0"


async def test_jobs_without_requests_skip_admission_on_any_worker(bundle):
    await beat(bundle)  # advertises nothing
    plain = await bundle.enqueue()
    assert bundle.coord._claim_policy.resources_seen is False
    assert (await bundle.claim("w1")).job.job_id == plain
    gpu_job = await bundle.enqueue(resources={"gpus": 1})
    assert bundle.coord._claim_policy.resources_seen is True
    refused = await bundle.claim("w1")
    assert refused.job is None and refused.detail.startswith("gpus: need 1, the worker has 0")
    del gpu_job


async def test_the_gpu_temperature_gate_refuses_p3_and_holds_with_hysteresis(bundle):
    await beat(bundle, gpu_temperature_c=86.0, user_idle_s=3600.0)
    job = await bundle.enqueue(priority=3)
    refused = await bundle.claim("w1")
    assert refused.job is None and "gpu_too_hot" in refused.reasons
    assert "gpu temperature 86 > 83" in refused.detail
    await beat(bundle, gpu_temperature_c=70.0, user_idle_s=3600.0)
    got = await bundle.claim("w1")
    assert got.job.job_id == job
    reply = await beat(bundle, gpu_temperature_c=85.0, user_idle_s=3600.0)
    assert reply.actions[0].action == "suspend" and "gpu_too_hot" in reply.actions[0].reason
    bundle.clock.advance(120)
    reply = await beat(bundle, gpu_temperature_c=80.0, user_idle_s=3600.0)
    assert reply.actions[0].action == "suspend"  # 80 is not below 83 - 5
    bundle.clock.advance(120)
    await beat(bundle, gpu_temperature_c=77.0, user_idle_s=3600.0)
    bundle.clock.advance(61)
    reply = await beat(bundle, gpu_temperature_c=77.0, user_idle_s=3600.0)
    assert reply.actions[0].action == "resume"


async def test_a_restarted_coordd_still_checks_stored_requests(make_bundle, tmp_path):
    first = await make_bundle()
    await first.enqueue(resources={"gpus": 1})
    await first.coord.close()
    from coordd import config as config_mod
    from coordd.daemon.server import sqlite_coordinator
    from coordd.clock import FakeClock
    coord = sqlite_coordinator(first.db_path, config_mod.load(None),
                               FakeClock(first.clock.wall()))
    await coord.start()
    try:
        assert coord._claim_policy.resources_seen is True
    finally:
        await coord.close()


async def test_a_p0_needing_vram_preempts_the_p3_run_holding_it(make_bundle):
    bundle = await make_bundle(preempt_min_runtime_s=30, reservation_s=60)
    slots = {"slots_total": 4, "slots": {"k": 4}}  # room by slots: only the GPU is full
    await beat(bundle, **box(gpu(0, 16000, 0)), **slots)
    p3 = await bundle.enqueue(priority=3, resources={"vram_mb": 12000})
    held = await bundle.claim("w1", lease_s=300)
    assert held.job.job_id == p3
    bundle.clock.advance(40)
    p0 = await bundle.enqueue(priority=0, resources={"vram_mb": 8000})
    cpu = await bundle.enqueue(priority=0)  # fits now: not a reason to preempt
    reply = await beat(bundle, **box(gpu(0, 16000, 12500)), **slots)
    act = {a.job_id: (a.action, a.reason) for a in reply.actions}[p3]
    assert act[0] == "vacate" and act[1].startswith(f"preempted_by {p0}")
    assert (await bundle.claim("w1")).detail.startswith(f"reserved for job {p0}: vram")
    from coordd.wire.workers import Release
    await bundle.coord.release(Release(job_id=p3, worker_id="w1", token=held.lease.token,
                                       reason="vacated"))
    await beat(bundle, **box(gpu(0, 16000, 300)), **slots)  # its memory is free now
    got = await bundle.claim("w1")
    assert got.job.job_id == p0 and got.job.gpu_ids == [0]
    assert (await bundle.claim("w1")).job.job_id == cpu
    back = await bundle.coord.get_job(JobId(job_id=p3))
    assert back.status == "waiting" and back.attempts == 0 and back.preemptions == 1


async def test_a_workflow_node_names_resources_like_a_job(bundle):
    import msgspec
    from coordd.wire.workflows import WorkflowSubmit
    spec = msgspec.convert({"name": "g", "nodes": [
        {"name": "a", "kind": "k", "required_role": "cpu", "resources": {"vram_mb": 9000}}]},
        WorkflowSubmit)
    await beat(bundle, **box(gpu(0, 8000, 0)))
    sub = await bundle.coord.workflow_submit(spec)
    refused = await bundle.claim("w1")
    assert refused.job is None and refused.detail == "vram: need 9000 MiB, 8000 free on gpu0"
    await beat(bundle, **box(gpu(0, 16000, 0)))
    assert (await bundle.claim("w1")).job.job_id == sub.jobs["a"]
    bad = msgspec.convert({"name": "h", "nodes": [
        {"name": "b", "kind": "k", "required_role": "cpu", "resources": {"vram_mb": -1}}]},
        WorkflowSubmit)
    with pytest.raises(errors.BadRequest, match=r"node 'b': resources\.vram_mb must be"):
        await bundle.coord.workflow_submit(bad)


# ---------------------------------------------------------------- the waiting reason's words


async def test_the_resource_reason_names_each_live_workers_gpus_in_one_sentence(bundle):
    await beat(bundle, "box1", **box(gpu(0, 16000, 12900), gpu(2, 16000, 14000), ram_mb=2000))
    await beat(bundle, "box2", **box(gpu(0, 24000, 20000), ram_mb=1000))
    job = await bundle.enqueue(resources={"vram_mb": 8000})
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.waiting_reason == ("waiting for resources: vram: need 8000 MiB; free: "
                                   "3100 on box1/gpu0, 2000 on box1/gpu2, 4000 on box2/gpu0")
    ram = await bundle.enqueue(resources={"ram_mb": 4000})
    shown = [j.waiting_reason for j in (await bundle.coord.list_jobs(
        ListJobs(status="waiting"))).jobs if j.job_id == ram]
    assert shown == ["waiting for resources: ram: need 4000 MiB; free: 2000 of 2000 on box1, "
                     "1000 of 1000 on box2"]
    mixed = await bundle.enqueue(resources={"gpus": 2})
    view = await bundle.coord.get_job(JobId(job_id=mixed))
    assert view.waiting_reason == ("waiting for resources: gpus: need 2 whole; free: 0 of 2 on "
                                   "box1 (gpu0 shows 12900 MiB in use) | gpus: need 2; has: 1 "
                                   "on box2")


async def test_the_resource_reason_leaves_out_stale_departed_and_gated_workers(bundle):
    await beat(bundle, "old", **box(gpu(0, 16000, 15000)))
    bundle.clock.advance(bundle.coord.config.heartbeat_stale_s + 1)  # "old" goes stale
    await beat(bundle, "live", **box(gpu(0, 16000, 12900)))
    await beat(bundle, "gone", **box(gpu(0, 16000, 14000)))
    await bundle.coord.goodbye(Goodbye(worker_id="gone"))
    await beat(bundle, "hot", **{**box(gpu(0, 16000, 14000)), "temperature_c": 99.0})
    job = await bundle.enqueue(resources={"vram_mb": 8000})
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.waiting_reason == "waiting for resources: vram: need 8000 MiB; free: 3100 on live/gpu0"
