"""Areas together over both stores: fleet limits with preemption, workflows, goodbyes and
the reaper, and concurrent claimers on a mix of jobs. The same bodies on SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.rules import limits
from coordd.service import workflows as flows
from coordd.clock import FakeClock
from coordd.wire.workflows import WorkflowSubmit
from coordd.rules.resources import Request
from coordd.store.api_governance import WorkerBeat
from coordd.service import Coordinator
from tests.store.conftest import COOL, T0, open_store
from tests.store.test_conformance_governance import FULL, beat, gov
from tests.store.test_conformance_limits import book, policy, ref
from tests.store.test_conformance_workflows import _corrupt_payload, node, plan, statuses


async def test_a_reserved_claim_holds_the_limit_units_of_the_job_it_takes(bundle):
    """A P0 asking a limit's unit preempts the P3 holding it; the reserved claim that takes
    the P0 holds its unit, so the limit stays within its concurrency."""
    lb = book(gpu={"concurrency": 1})
    bundle.policy = policy(lb)
    g = gov()
    p3 = await bundle.enqueue(priority=3, limits=[("gpu", 1)])
    await beat(bundle, g, "a", T0, {**COOL, **FULL})
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    assert got.job.job_id == p3
    p0 = await bundle.enqueue(now=T0 + 20, priority=0, limits=[("gpu", 1)])
    other = await bundle.enqueue(now=T0 + 20, priority=1, limits=[("gpu", 1)])
    assert (await beat(bundle, g, "a", T0 + 40, {**COOL, **FULL})).preempted == [(p0, p3, "a")]
    await bundle.store.release(ref(got, "a"), "vacated", now=T0 + 43)
    taken = await bundle.claim("a", now=T0 + 44, lease_s=300.0)
    assert taken.job.job_id == p0
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 44)
    assert views[0].used == 1 and [h.job_id for h in views[0].holders] == [p0]
    await bundle.worker("b", now=T0 + 44)
    refused = await bundle.claim("b", now=T0 + 45)
    assert refused.job is None and refused.reasons == [limits.LIMIT_REFUSED], other


async def test_a_reserved_job_waits_while_its_limit_is_full(bundle):
    """The reservation promises the victim's slot, not a unit someone else holds: while
    the P0's limit is full the reserved claim does not take it."""
    lb = book(gpu={"concurrency": 1})
    bundle.policy = policy(lb)
    g = gov()
    await bundle.worker("z", now=T0)
    held = await bundle.enqueue(priority=2, limits=[("gpu", 1)])
    assert (await bundle.claim("z", now=T0, lease_s=300.0)).job.job_id == held
    p3 = await bundle.enqueue(now=T0 + 1, priority=3)
    await beat(bundle, g, "a", T0 + 1, {**COOL, **FULL})
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    assert got.job.job_id == p3
    p0 = await bundle.enqueue(now=T0 + 20, priority=0, limits=[("gpu", 1)])
    hb = await beat(bundle, g, "a", T0 + 40, {**COOL, **FULL})
    if not hb.preempted:  # a store that sees the limit is full need not preempt at all
        return
    assert hb.preempted == [(p0, p3, "a")]
    await bundle.store.release(ref(got, "a"), "vacated", now=T0 + 43)
    refused = await bundle.claim("a", now=T0 + 44, lease_s=300.0)
    assert refused.job is None or refused.job.job_id != p0
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 44)
    assert views[0].used == 1 and [h.job_id for h in views[0].holders] == [held]


async def test_concurrent_claimers_on_a_mix_of_plain_limited_and_node_jobs(bundle, request,
                                                                             tmp_path):
    """16 claimers (on PostgreSQL over two stores, so two pools of sessions) claim, complete,
    fail and release a mix of plain jobs, limited jobs and workflow nodes at once: no job
    is claimed twice under one token, the limit's concurrency is never passed, no error
    but the holder-call refusals, every job ends, no unit is held once all leases are
    gone and status counts agree with the full counts."""
    coord = Coordinator(bundle.store, config_mod.load(None), FakeClock(T0))
    coord._ids = bundle.ids  # one id sequence for jobs and nodes: no collision

    def one_plan(nodes, name):
        spec = msgspec.convert({"name": name, "nodes": nodes}, WorkflowSubmit)
        return flows.Workflows(coord).plan(spec)

    lb = book(gpu={"concurrency": 3})
    bundle.policy = policy(lb)
    stores = [bundle.store]
    if bundle.kind == "postgres":
        stores.append(await open_store("postgres", request, tmp_path, pool_min=1, pool_max=8))
    try:
        ids = [await bundle.enqueue(limits=[("gpu", 1)], max_attempts=2) for _ in range(30)]
        ids += [await bundle.enqueue(limits=[]) for _ in range(30)]
        wfs = []
        for i in range(6):
            wf = one_plan([node("a"), node("b", "a"), node("c", "a"),
                           node("d", {"node": "b", "policy": "run"},
                                {"node": "c", "policy": "run"})], name=f"w{i}")
            wfs.append(wf)
            await bundle.store.workflow_submit(wf, now=T0)
        for w in range(16):
            await bundle.worker(f"w{w}", now=T0)
        rng = random.Random(7)
        running = {"gpu": 0, "max": 0}
        taken: set[tuple[str, int]] = set()
        limited = set(ids[:30])

        async def claimer(w: int) -> None:
            st = stores[w % len(stores)]
            wid = f"w{w}"
            idle = 0
            while idle < 3:
                got = await st.claim(wid, 30.0, bundle.policy, now=T0 + 1)
                if got.job is None:
                    idle += 1
                    await asyncio.sleep(0.01)
                    continue
                idle = 0
                key = (got.job.job_id, got.lease.token)
                assert key not in taken
                taken.add(key)
                gpu = got.job.job_id in limited
                if gpu:
                    running["gpu"] += 1
                    running["max"] = max(running["max"], running["gpu"])
                await asyncio.sleep(0)
                if gpu:
                    running["gpu"] -= 1
                r = ref(got, wid)
                roll = rng.random()
                if roll < 0.2:
                    await st.fail(r, "x", True, lambda n: 0.0, now=T0 + 1)
                elif roll < 0.3:
                    await st.release(r, "vacated", now=T0 + 1)
                else:
                    await st.complete(r, '"ok"', now=T0 + 1)

        await asyncio.gather(*(claimer(w) for w in range(16)))
        assert running["max"] <= 3
        st = bundle.store
        for wf in wfs:
            view = await st.workflow_get(wf.workflow_id)
            assert view.status in ("succeeded", "failed", "partial"), (view.status, [
                (n.name, n.status) for n in view.nodes])
        views, _ = await st.limit_views(lb, ["gpu"], True, now=T0 + 2)
        assert views[0].used == 0 and views[0].holders == []
        status = await st.status(30.0, now=T0 + 2)
        assert status.jobs.get("running", 0) == 0 and status.jobs.get("waiting", 0) == 0
        assert sum(status.jobs.values()) == 60 + 24
        full: dict[str, int] = {}
        for job_id in ids + [n.job_id for wf in wfs for n in wf.nodes]:
            got = (await st.get_job(job_id, now=T0 + 2)).status
            full[got] = full.get(got, 0) + 1
        assert {k: v for k, v in status.jobs.items() if v} == full
    finally:
        for extra in stores[1:]:
            await extra.close()


async def _node_and_limited(bundle, lease_s: float = 300.0):
    """Worker w holding a workflow node (its last attempt) and a limited job."""
    lb = book(gpu={"concurrency": 1})
    bundle.policy = policy(lb)
    wf = plan(bundle, [node("a", max_attempts=1), node("b", "a")])
    await bundle.store.workflow_submit(wf, now=T0)
    gpu = await bundle.enqueue(limits=[("gpu", 1)], max_attempts=1)
    return lb, wf, gpu


async def _ends_both(bundle, lb, wf, gpu) -> None:
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 50)
    assert views[0].used == 0 and views[0].holders == []
    assert (await bundle.store.get_job(gpu, now=T0 + 50)).status == "failed"
    await bundle.store.workflow_settle_running(now=T0 + 50)
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert (view.status, statuses(view)) == ("failed", {"a": "failed", "b": "skipped"})
    status = await bundle.store.status(30.0, now=T0 + 50)
    assert status.jobs.get("running", 0) == 0


async def test_a_goodbye_ends_a_node_and_a_limited_lease_at_once(bundle):
    lb, wf, gpu = await _node_and_limited(bundle)
    await bundle.store.heartbeat_governed("w", ["cpu"], {}, WorkerBeat(incarnation="i1"),
                                          gov(), now=T0)
    await bundle.worker("w", now=T0)
    got = [await bundle.claim("w", now=T0 + 1, lease_s=300.0) for _ in range(2)]
    assert {g.job.job_id for g in got} >= {gpu}
    assert sorted(await bundle.store.goodbye("w", "i1", now=T0 + 2)) == sorted(
        g.job.job_id for g in got)
    await _ends_both(bundle, lb, wf, gpu)


async def test_a_new_incarnation_ends_a_node_and_a_limited_lease_at_once(bundle):
    lb, wf, gpu = await _node_and_limited(bundle)
    await bundle.store.heartbeat_governed("w", ["cpu"], COOL, WorkerBeat(incarnation="i1"),
                                          gov(), now=T0)
    got = [await bundle.claim("w", now=T0 + 1, lease_s=300.0) for _ in range(2)]
    assert all(g.job is not None for g in got)
    await bundle.store.heartbeat_governed("w", ["cpu"], COOL, WorkerBeat(incarnation="i2"),
                                          gov(), now=T0 + 2)
    await _ends_both(bundle, lb, wf, gpu)


async def test_one_reap_ends_a_node_lease_and_a_limited_lease(bundle):
    lb, wf, gpu = await _node_and_limited(bundle)
    await bundle.worker("w", now=T0)
    got = [await bundle.claim("w", now=T0 + 1, lease_s=5.0) for _ in range(2)]
    assert all(g.job is not None for g in got)
    assert await bundle.store.reap(now=T0 + 10) == 2
    await _ends_both(bundle, lb, wf, gpu)


async def test_cancel_of_a_running_limited_node_workflow(bundle):
    """Cancel a running limited job and a running node; their holders' ends free the
    unit and settle the workflow."""
    lb, wf, gpu = await _node_and_limited(bundle)
    await bundle.worker("w", now=T0)
    got = {g.job.job_id: g for g in [await bundle.claim("w", now=T0 + 1) for _ in range(2)]}
    await bundle.store.workflow_cancel(wf.workflow_id, now=T0 + 2) \
        if hasattr(bundle.store, "workflow_cancel") else None
    await bundle.store.cancel(gpu, now=T0 + 2)
    for job_id, g in got.items():
        res = await bundle.store.complete(ref(g, "w"), '"ok"', now=T0 + 3)
        assert res.status == "cancelled", job_id
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 4)
    assert views[0].used == 0
    await bundle.store.workflow_settle_running(now=T0 + 4)
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert view.status in ("cancelled", "failed"), (view.status, statuses(view))


async def test_a_result_schema_refusal_frees_the_limit_unit(bundle):
    """Limited jobs with a result schema completed at once (one batch on PostgreSQL), one
    result invalid: each lease ends, both units are freed, the invalid one waits again."""
    lb = book(gpu={"concurrency": 2})
    bundle.policy = policy(lb)
    jobs = [msgspec.structs.replace(bundle.job(), result_schema="claims", limits=[("gpu", 1)])
            for _ in range(3)]
    await bundle.store.enqueue(jobs, now=T0)
    await bundle.worker("a")
    got = [await bundle.claim("a", now=T0 + 1) for _ in range(2)]
    assert (await bundle.claim("a", now=T0 + 1)).reasons == [limits.LIMIT_REFUSED]
    bad, good = await asyncio.gather(
        bundle.store.complete(ref(got[0], "a"), '{"claims": [{"text": "x", "label": "no"}]}',
                              now=T0 + 2),
        bundle.store.complete(ref(got[1], "a"), '{"claims": []}', now=T0 + 2))
    assert (bad.status, good.status) == ("waiting", "succeeded")
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 2)
    assert views[0].used == 0 and views[0].waiting == 2
    assert (await bundle.claim("a", now=T0 + 3)).job is not None


@pytest.mark.parametrize("path", ["limits", "resources"])
async def test_postgres_admission_dead_letter_of_a_node_keeps_the_lock_order(bundle, path):
    """An admission claim (fleet limits, or resource requests seen) that takes a node whose
    payload does not decode dead-letters it and settles its workflow; a session holding
    the workflow's lock and then writing the node (workflow-then-node, as cancel does)
    must not deadlock with it."""
    if bundle.kind != "postgres":
        pytest.skip("one SQLite writer takes no row locks")
    if path == "limits":
        bundle.policy = policy(book(gpu={"concurrency": 1}))
    else:
        await bundle.enqueue(priority=3, resources=Request(gpus=1))
    wf = plan(bundle, [node("a"), node("b", "a")])
    ids = (await bundle.store.workflow_submit(wf, now=T0)).jobs
    await _corrupt_payload(bundle, ids["a"])
    await bundle.worker("w", now=T0)
    async with bundle.store._conn() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("SELECT 1 FROM workflows WHERE workflow_id = $1 FOR UPDATE",
                           wf.workflow_id)
        claim = asyncio.ensure_future(bundle.claim("w", now=T0 + 1))
        await asyncio.sleep(0.3)  # the claim has taken the node and waits on the workflow
        await conn.execute("UPDATE jobs SET updated_at = updated_at WHERE job_id = $1",
                           ids["a"])
        await tx.commit()
    assert (await claim).job is None
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert view.status == "failed"


async def test_a_vacated_node_waits_again_and_its_workflow_goes_on(bundle):
    """A P3 node on a full worker is preempted by a P0 (a limited job): the node's release
    requeues it in its workflow, the P0 takes the slot and its unit, the node then runs
    and the workflow succeeds."""
    lb = book(gpu={"concurrency": 1})
    bundle.policy = policy(lb)
    g = gov()
    wf = plan(bundle, [node("a", priority=3), node("b", "a", priority=3)])
    ids = (await bundle.store.workflow_submit(wf, now=T0)).jobs
    await beat(bundle, g, "a", T0, {**COOL, **FULL})
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    assert got.job.job_id == ids["a"]
    p0 = await bundle.enqueue(now=T0 + 20, priority=0, limits=[("gpu", 1)])
    assert (await beat(bundle, g, "a", T0 + 40, {**COOL, **FULL})).preempted == [
        (p0, ids["a"], "a")]
    assert (await bundle.store.release(ref(got, "a"), "vacated", now=T0 + 43)).status \
        == "waiting"
    assert statuses(await bundle.store.workflow_get(wf.workflow_id)) == {
        "a": "waiting", "b": "blocked"}
    taken = await bundle.claim("a", now=T0 + 44, lease_s=300.0)
    assert taken.job.job_id == p0
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 44)
    assert [h.job_id for h in views[0].holders] == [p0]
    await bundle.store.complete(ref(taken, "a"), '"ok"', now=T0 + 45)
    for now in (T0 + 46, T0 + 47):
        again = await bundle.claim("a", now=now)
        await bundle.store.complete(ref(again, "a"), '"ok"', now=now)
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert (view.status, statuses(view)) == ("succeeded", {"a": "succeeded", "b": "succeeded"})


async def test_concurrent_reaper_and_goodbyes_amid_limited_and_node_claims(bundle, request,
                                                                            tmp_path):
    """Claimers holding limited jobs and nodes while a reaper round and goodbyes end their
    leases at once: the holders' calls are refused with lease codes only, every unit is
    freed, every workflow moves on, and nothing is left running."""
    coord = Coordinator(bundle.store, config_mod.load(None), FakeClock(T0))
    coord._ids = bundle.ids
    lb = book(gpu={"concurrency": 4})
    bundle.policy = policy(lb)
    stores = [bundle.store]
    if bundle.kind == "postgres":
        stores.append(await open_store("postgres", request, tmp_path, pool_min=1, pool_max=8))
    try:
        for _ in range(12):
            await bundle.enqueue(limits=[("gpu", 1)], max_attempts=5)
            await bundle.enqueue(limits=[], max_attempts=5)
        wfs = []
        for i in range(4):
            spec = msgspec.convert({"name": f"w{i}", "nodes": [
                node("a", max_attempts=5), node("b", "a", max_attempts=5),
                node("c", "a", max_attempts=5)]}, WorkflowSubmit)
            wfs.append(flows.Workflows(coord).plan(spec))
            await bundle.store.workflow_submit(wfs[-1], now=T0)
        for w in range(12):
            await bundle.store.heartbeat_governed(f"w{w}", ["cpu"], COOL,
                                                  WorkerBeat(incarnation="i1"), gov(), now=T0)
        clock = {"t": T0 + 1}

        async def claimer(w: int) -> None:
            st = stores[w % len(stores)]
            for _ in range(12):
                got = await st.claim(f"w{w}", 5.0, bundle.policy, now=clock["t"])
                if got.job is None:
                    await asyncio.sleep(0.01)
                    continue
                await asyncio.sleep(0.005)
                try:
                    await st.complete(ref(got, f"w{w}"), '"ok"', now=clock["t"])
                except errors.CoordError as exc:
                    assert exc.code in ("lease_expired", "lease_lost"), exc

        async def ender() -> None:
            for k in range(6):
                await asyncio.sleep(0.02)
                clock["t"] += 6.0
                st = stores[k % len(stores)]
                await st.reap(now=clock["t"])
                for w in (k, k + 6):
                    await st.goodbye(f"w{w}", "i1", now=clock["t"])
                    await st.heartbeat_governed(f"w{w}", ["cpu"], COOL,
                                                WorkerBeat(incarnation="i1"), gov(),
                                                now=clock["t"])

        await asyncio.gather(ender(), *(claimer(w) for w in range(12)))
        clock["t"] += 10.0
        st = bundle.store
        await st.reap(now=clock["t"])
        await st.workflow_settle_running(now=clock["t"])
        views, _ = await st.limit_views(lb, ["gpu"], True, now=clock["t"])
        assert views[0].used == 0 and views[0].holders == []
        status = await st.status(30.0, now=clock["t"])
        assert status.jobs.get("running", 0) == 0
        for wf in wfs:
            view = await st.workflow_get(wf.workflow_id)
            nodes = {n.name: n.status for n in view.nodes}
            assert not (nodes["a"] in ("waiting",) and "waiting" in (nodes["b"], nodes["c"]))
            if nodes["a"] == "succeeded":
                assert nodes["b"] != "blocked" and nodes["c"] != "blocked", nodes
    finally:
        for extra in stores[1:]:
            await extra.close()
