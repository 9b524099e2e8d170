"""Workflows over both stores (coordd.store.api_workflows): the same graph, the same pinned
times, the same replies, statuses, payloads and events from SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.service import workflows as flows
from coordd.clock import FakeClock
from coordd.wire.workflows import WorkflowSubmit
from coordd.store.api import LeaseRef
from coordd.service import Coordinator
from tests.store.conftest import T0, open_store


def plan(bundle: Any, nodes: list[dict[str, Any]], name: str = "wf", **kw: Any) -> Any:
    """A validated graph (the RPC's own checks: coordd.service.workflows.Workflows.plan)."""
    coord = Coordinator(bundle.store, config_mod.load(None), FakeClock(T0))
    spec = msgspec.convert({"name": name, "nodes": nodes, **kw}, WorkflowSubmit)
    return flows.Workflows(coord).plan(spec)


def node(name: str, *needs: Any, **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": "k", "required_role": "cpu", "needs": list(needs), **kw}


def ref(got: Any, worker_id: str) -> LeaseRef:
    return LeaseRef(got.job.job_id, worker_id, got.lease.token)


def statuses(view: Any) -> dict[str, str]:
    return {n.name: n.status for n in view.nodes}


async def run_node(bundle: Any, worker_id: str, now: float, result: str) -> str:
    """Claim the next job as `worker_id` and complete it with `result`; its job id."""
    got = await bundle.claim(worker_id, now=now)
    assert (await bundle.store.complete(ref(got, worker_id), result, now=now)).status \
        == "succeeded"
    return got.job.job_id


async def test_a_diamond_runs_in_dependency_order(bundle):
    """a -> (b, c) -> d: only a is claimable at first; b and c once a succeeded, with its
    result under `inputs`; d last, with both; the workflow ends succeeded."""
    wf = plan(bundle, [node("a", payload={"n": 1}), node("b", "a"), node("c", "a"),
                       node("d", "b", "c")])
    res = await bundle.store.workflow_submit(wf, now=T0)
    assert res.created and res.workflow_id == wf.workflow_id
    ids = res.jobs
    assert list(ids) == ["a", "b", "c", "d"]
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert statuses(view) == {"a": "waiting", "b": "blocked", "c": "blocked", "d": "blocked"}
    assert (view.status, view.created_at, view.counts) == (
        "running", T0, {"waiting": 1, "blocked": 3})
    assert [(n.name, [(e.node, e.policy) for e in n.needs]) for n in view.nodes] == [
        ("a", []), ("b", [("a", "skip")]), ("c", [("a", "skip")]),
        ("d", [("b", "skip"), ("c", "skip")])]
    await bundle.worker("w", now=T0)
    assert await run_node(bundle, "w", T0 + 1, '{"from": "a"}') == ids["a"]
    got_b = await bundle.claim("w", now=T0 + 2)
    got_c = await bundle.claim("w", now=T0 + 2)
    assert (got_b.job.job_id, got_c.job.job_id) == (ids["b"], ids["c"])
    assert got_b.job.payload == {"inputs": {"a": {"from": "a"}}}
    assert (await bundle.claim("w", now=T0 + 2)).job is None  # d waits for b and c
    await bundle.store.complete(ref(got_b, "w"), '"B"', now=T0 + 3)
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert statuses(view)["d"] == "blocked"
    await bundle.store.complete(ref(got_c, "w"), '"C"', now=T0 + 4)
    got_d = await bundle.claim("w", now=T0 + 5)
    assert got_d.job.job_id == ids["d"] and got_d.job.payload == {"inputs": {"b": "B", "c": "C"}}
    await bundle.store.complete(ref(got_d, "w"), '"D"', now=T0 + 6)
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert (view.status, view.finished_at, view.updated_at) == ("succeeded", T0 + 6, T0 + 6)
    assert view.summary == {"succeeded": ["a", "b", "c", "d"], "failed": [], "skipped": [],
                            "cancelled": [], "missing_roles": []}
    assert [n.result for n in view.nodes] == [{"from": "a"}, "B", "C", "D"]
    events = (await bundle.store.get_job(ids["d"], now=T0 + 6)).events
    assert [(e.at, e.from_status, e.to_status, e.reason) for e in events] == [
        (T0, None, "blocked", f"workflow {wf.workflow_id} node d (needs b, c)"),
        (T0 + 4, "blocked", "waiting", "dependencies met"),
        (T0 + 5, "waiting", "running", "claimed (token 1)"),
        (T0 + 6, "running", "succeeded", None)]


async def test_a_failed_node_skips_its_dependents_and_the_workflow_fails(bundle):
    """a fails for good: b (skip policy) and c (needs b) are skipped with the reason; r
    (policy run) still runs, told what is missing; retry of a reopens the workflow."""
    wf = plan(bundle, [node("a"), node("b", "a"), node("c", "b"),
                       node("r", {"node": "a", "policy": "run"})])
    ids = (await bundle.store.workflow_submit(wf, now=T0)).jobs
    await bundle.worker("w", now=T0)
    got = await bundle.claim("w", now=T0 + 1)
    res = await bundle.store.fail(ref(got, "w"), "bad input", False, lambda n: 0.0,
                                  now=T0 + 2)
    assert res.status == "failed"
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert statuses(view) == {"a": "failed", "b": "skipped", "c": "skipped", "r": "waiting"}
    reasons = {n.name: n.reason for n in view.nodes}
    assert (reasons["b"], reasons["c"]) == ("dependency_failed: a", "dependency_skipped: b")
    got_r = await bundle.claim("w", now=T0 + 3)
    assert got_r.job.payload == {"inputs": {}, "missing_inputs": ["a"]}
    await bundle.store.fail(ref(got_r, "w"), "also bad", False, lambda n: 0.0, now=T0 + 4)
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert (view.status, view.finished_at) == ("failed", T0 + 4)
    assert view.summary["failed"] == [{"node": "a", "reason": "permanent: bad input"},
                                      {"node": "r", "reason": "permanent: also bad"}]
    assert view.summary["skipped"] == [{"node": "b", "reason": "dependency_failed: a"},
                                       {"node": "c", "reason": "dependency_skipped: b"}]
    listed = (await bundle.store.workflow_list("failed", 10)).workflows
    assert [(w.workflow_id, w.counts) for w in listed] == [
        (wf.workflow_id, {"failed": 2, "skipped": 2})]
    # the operator's way back: retry the failed node; its dependents are blocked again
    assert (await bundle.store.retry(ids["a"], now=T0 + 5)).status == "waiting"
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert (view.status, view.finished_at, view.summary) == ("running", None, None)
    assert statuses(view) == {"a": "waiting", "b": "blocked", "c": "blocked", "r": "failed"}
    await run_node(bundle, "w", T0 + 6, '"A"')
    assert statuses(await bundle.store.workflow_get(wf.workflow_id))["b"] == "waiting"


async def test_cancel_a_workflow(bundle):
    """Cancel stops what has not ended: blocked and waiting nodes at once, a running one
    by request (its holder's complete ends it cancelled); the workflow ends cancelled."""
    wf = plan(bundle, [node("a"), node("b", "a"), node("x")])
    ids = (await bundle.store.workflow_submit(wf, now=T0)).jobs
    await bundle.worker("w", now=T0)
    got = await bundle.claim("w", now=T0 + 1)
    assert got.job.job_id == ids["a"]
    view = await bundle.store.workflow_cancel(wf.workflow_id, now=T0 + 2)
    assert view.status == "running"
    assert statuses(view) == {"a": "running", "b": "cancelled", "x": "cancelled"}
    assert (await bundle.store.renew(ref(got, "w"), 30.0, now=T0 + 3)).cancel_requested
    assert (await bundle.store.complete(ref(got, "w"), '"late"', now=T0 + 4)).status \
        == "cancelled"
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert (view.status, view.finished_at) == ("cancelled", T0 + 4)
    assert view.summary["cancelled"] == [
        {"node": "a", "reason": "cancelled before completion"},
        {"node": "x", "reason": "cancelled by admin"},  # topological order: a, x, b
        {"node": "b", "reason": "cancelled by admin"}]
    again = await bundle.store.workflow_cancel(wf.workflow_id, now=T0 + 5)
    assert (again.status, again.updated_at) == ("cancelled", T0 + 4)  # nothing left to do
    with pytest.raises(errors.NotFound):
        await bundle.store.workflow_cancel("nope", now=T0)
    with pytest.raises(errors.NotFound):
        await bundle.store.workflow_get("nope")


async def test_cancel_of_one_node_moves_its_dependents(bundle):
    wf = plan(bundle, [node("a"), node("b", "a"), node("r", {"node": "a", "policy": "run"})])
    ids = (await bundle.store.workflow_submit(wf, now=T0)).jobs
    assert (await bundle.store.cancel(ids["a"], now=T0 + 1)).status == "cancelled"
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert statuses(view) == {"a": "cancelled", "b": "skipped", "r": "waiting"}
    assert view.nodes[1].reason == "dependency_cancelled: a"


async def test_a_node_reaped_after_its_lease_expired(bundle):
    """An expired lease with attempts left: the node is requeued and runs again, its
    dependents after it. With its last attempt spent: failed, its dependents skipped and
    the workflow failed (PostgreSQL in the reaper's transaction, SQLite at the next
    maintenance settle; both after `workflow_settle_running`)."""
    wf = plan(bundle, [node("a", max_attempts=2), node("b", "a")])
    ids = (await bundle.store.workflow_submit(wf, now=T0)).jobs
    await bundle.worker("w1", now=T0)
    await bundle.claim("w1", now=T0 + 1, lease_s=5.0)
    assert await bundle.store.reap(now=T0 + 6) == 1
    view = await bundle.store.get_job(ids["a"], now=T0 + 6)
    assert (view.status, view.last_error) == ("waiting", "lease_expired (worker w1 lost)")
    await bundle.worker("w2", now=T0 + 6)
    assert await run_node(bundle, "w2", T0 + 7, '"A"') == ids["a"]
    assert statuses(await bundle.store.workflow_get(wf.workflow_id))["b"] == "waiting"

    last = plan(bundle, [node("a", max_attempts=1), node("b", "a")], name="last")
    ids = (await bundle.store.workflow_submit(last, now=T0 + 8)).jobs
    await bundle.claim("w2", now=T0 + 9)  # b of the first workflow
    got = await bundle.claim("w2", now=T0 + 9, lease_s=5.0)
    assert got.job.job_id == ids["a"]
    assert await bundle.store.reap(now=T0 + 15) == 1
    settled_by_sweep = 1 if bundle.kind == "sqlite" else 0
    assert await bundle.store.workflow_settle_running(now=T0 + 15) == settled_by_sweep
    assert await bundle.store.workflow_settle_running(now=T0 + 16) == 0
    view = await bundle.store.workflow_get(last.workflow_id)
    assert (view.status, view.finished_at) == ("failed", T0 + 15)
    assert statuses(view) == {"a": "failed", "b": "skipped"}
    assert view.summary["failed"] == [{"node": "a",
                                       "reason": "attempts exhausted (last: lease_expired)"}]
    events = (await bundle.store.get_job(ids["b"], now=T0 + 16)).events
    assert [(e.at, e.to_status, e.reason) for e in events][-1] == (
        T0 + 15, "skipped", "dependency_failed: a")


async def test_postgres_settles_a_reaped_node_in_the_reapers_transaction(bundle):
    """PostgreSQL needs no maintenance round: the reap that spends the last attempt ends
    the workflow."""
    if bundle.kind != "postgres":
        pytest.skip("SQLite settles expired nodes in its maintenance round")
    wf = plan(bundle, [node("a", max_attempts=1), node("b", "a")])
    await bundle.store.workflow_submit(wf, now=T0)
    await bundle.worker("w", now=T0)
    await bundle.claim("w", now=T0, lease_s=5.0)
    assert await bundle.store.reap(now=T0 + 5) == 1
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert (view.status, statuses(view)) == ("failed", {"a": "failed", "b": "skipped"})
    assert await bundle.store.workflow_settle_running(now=T0 + 6) == 0


async def test_a_goodbye_that_spends_a_nodes_last_attempt_ends_its_workflow(bundle):
    """A worker's goodbye ends its node's lease (`worker_lost`); the node had no attempt
    left, so it fails and its dependent is skipped: at once on PostgreSQL (in the
    goodbye's transaction), at the next maintenance round on SQLite."""
    from coordd.store.api_governance import WorkerBeat
    from tests.store.test_conformance_governance import gov
    wf = plan(bundle, [node("a", max_attempts=1), node("b", "a")])
    await bundle.store.workflow_submit(wf, now=T0)
    await bundle.store.heartbeat_governed("w", ["cpu"], {}, WorkerBeat(incarnation="i1"),
                                          gov(), now=T0)
    await bundle.worker("w", now=T0)
    got = await bundle.claim("w", now=T0, lease_s=300.0)
    assert await bundle.store.goodbye("w", "i1", now=T0 + 1) == [got.job.job_id]
    settled_by_sweep = 1 if bundle.kind == "sqlite" else 0
    assert await bundle.store.workflow_settle_running(now=T0 + 1) == settled_by_sweep
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert (view.status, statuses(view)) == ("failed", {"a": "failed", "b": "skipped"})


async def test_repeated_submit_with_an_idempotency_key(bundle):
    wf = plan(bundle, [node("a"), node("b", "a")], idempotency_key="nightly-1")
    first = await bundle.store.workflow_submit(wf, now=T0)
    again = await bundle.store.workflow_submit(
        plan(bundle, [node("a"), node("b", "a")], idempotency_key="nightly-1"), now=T0 + 1)
    assert first.created and not again.created
    assert (again.workflow_id, again.jobs) == (first.workflow_id, first.jobs)
    with pytest.raises(errors.InvalidState, match="was used for another graph"):
        await bundle.store.workflow_submit(
            plan(bundle, [node("a")], idempotency_key="nightly-1"), now=T0 + 2)
    listed = (await bundle.store.workflow_list(None, 10)).workflows
    assert [(w.workflow_id, w.idempotency_key) for w in listed] == [
        (first.workflow_id, "nightly-1")]
    assert (await bundle.store.status(30.0, now=T0 + 3)).jobs["blocked"] == 1


async def test_list_is_newest_first_with_counts(bundle):
    made = []
    for i in range(3):
        made.append((await bundle.store.workflow_submit(
            plan(bundle, [node("a"), node("b", "a")], name=f"w{i}"), now=T0 + i)).workflow_id)
    listed = (await bundle.store.workflow_list(None, 2)).workflows
    assert [w.workflow_id for w in listed] == made[:0:-1]
    assert [(w.name, w.status, w.counts, w.nodes) for w in listed] == [
        ("w2", "running", {"waiting": 1, "blocked": 1}, []),
        ("w1", "running", {"waiting": 1, "blocked": 1}, [])]
    assert (await bundle.store.workflow_list("succeeded", 10)).workflows == []


async def test_postgres_nodes_ending_at_once_in_two_sessions_queue_their_dependent(
        bundle, request, tmp_path):
    """Two nodes of one workflow end in two transactions at the same moment (two stores,
    two connections): each settle waits for the other's (the workflow's row lock), so the
    node that needs both is queued every time, never left blocked."""
    if bundle.kind != "postgres":
        pytest.skip("one SQLite writer cannot end two nodes at once")
    other = await open_store("postgres", request, tmp_path, pool_min=1, pool_max=4)
    try:
        await bundle.worker("w", now=T0)
        rounds = 12
        wfs = [plan(bundle, [node("a"), node("b"), node("c", {"node": "a", "policy": "run"},
                                                     {"node": "b", "policy": "run"})],
                    name=f"r{i}") for i in range(rounds)]
        for wf in wfs:
            await bundle.store.workflow_submit(wf, now=T0)
        held = [await bundle.claim("w", now=T0 + 1) for _ in range(2 * rounds)]

        async def fail(st: Any, got: Any) -> None:
            await st.fail(ref(got, "w"), "x", False, lambda n: 0.0, now=T0 + 2)
        await asyncio.gather(*(fail(bundle.store if i % 2 else other, g)
                               for i, g in enumerate(held)))
        for wf in wfs:
            assert statuses(await bundle.store.workflow_get(wf.workflow_id))["c"] == "waiting"
    finally:
        await other.close()


async def _corrupt_payload(bundle: Any, job_id: str) -> None:
    """Store a payload that is not JSON (as a hand edit would), on either store."""
    if bundle.kind == "sqlite":
        await bundle.store.writer.run(lambda conn, now: conn.execute(
            "UPDATE jobs SET payload_json = '{bad' WHERE job_id = ?", (job_id,)))
        return
    async with bundle.store._conn() as conn:
        await conn.execute("UPDATE jobs SET payload_json = '{bad' WHERE job_id = $1", job_id)


async def test_the_other_ends_of_a_node_move_its_workflow(bundle):
    """A release that meets a requested cancel, and a node dead-lettered by the claim
    (its stored payload is not JSON), end their nodes: the dependents follow (PostgreSQL
    in the same transaction, SQLite's dead letter at the maintenance settle)."""
    wf = plan(bundle, [node("a"), node("b", "a")], name="released")
    ids = (await bundle.store.workflow_submit(wf, now=T0)).jobs
    await bundle.worker("w", now=T0)
    got = await bundle.claim("w", now=T0 + 1)
    await bundle.store.cancel(ids["a"], now=T0 + 2)
    assert (await bundle.store.release(ref(got, "w"), "vacate", now=T0 + 3)).status \
        == "cancelled"
    view = await bundle.store.workflow_get(wf.workflow_id)
    # nothing succeeded and not every node was cancelled (b was skipped): failed
    assert (view.status, statuses(view)) == ("failed", {"a": "cancelled", "b": "skipped"})

    bad = plan(bundle, [node("a"), node("b", "a")], name="undecodable")
    ids = (await bundle.store.workflow_submit(bad, now=T0 + 4)).jobs
    await _corrupt_payload(bundle, ids["a"])
    assert (await bundle.claim("w", now=T0 + 5)).job is None
    assert (await bundle.store.workflow_settle_running(now=T0 + 5)) == (
        1 if bundle.kind == "sqlite" else 0)
    view = await bundle.store.workflow_get(bad.workflow_id)
    assert (view.status, statuses(view)) == ("failed", {"a": "failed", "b": "skipped"})
    assert view.nodes[0].reason.startswith("payload_decode_error")


async def test_a_nodes_own_fields_are_stored_and_claimed_by_them(bundle):
    """Kind, role, priority, attempts, max runtime and payload per node, as submitted;
    claims route a promoted node by its role and order nodes by their priority."""
    wf = plan(bundle, [
        node("prep", kind="fetch", max_attempts=5, max_runtime_s=60.0, payload={"url": "u"}),
        node("train", "prep", kind="train", required_role="gpu", priority=3),
        node("eval", "prep", kind="eval", priority=0)])
    ids = (await bundle.store.workflow_submit(wf, now=T0)).jobs
    prep = await bundle.store.get_job(ids["prep"], now=T0)
    assert (prep.kind, prep.required_role, prep.priority, prep.max_attempts,
            prep.max_runtime_s, prep.payload) == ("fetch", "cpu", 2, 5, 60.0, {"url": "u"})
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert [(n.name, n.kind, n.required_role, n.max_attempts) for n in view.nodes] == [
        ("prep", "fetch", "cpu", 5), ("train", "train", "gpu", 3), ("eval", "eval", "cpu", 3)]
    await bundle.worker("c", now=T0)
    await bundle.worker("g", now=T0, roles=["gpu", "cpu"])
    await run_node(bundle, "c", T0 + 1, '"data"')
    assert (await bundle.claim("g", now=T0 + 2)).job.job_id == ids["eval"]  # P0 first
    got = await bundle.claim("g", now=T0 + 2)
    assert (got.job.job_id, got.job.kind, got.job.priority) == (ids["train"], "train", 3)
    assert (await bundle.claim("c", now=T0 + 2)).job is None


async def test_a_node_no_live_worker_can_run_is_skipped_worker_absent(bundle):
    """A waiting node whose role no worker with a fresh heartbeat advertises is skipped
    with reason `worker_absent` once it waited `wait_s` (not before; not while a live
    worker offers the role), its dependents follow and its graph ends."""
    wf = plan(bundle, [node("a"), node("build", "a", required_role="build"),
                       node("report", "build")])
    other = plan(bundle, [node("solo", priority=3)], name="other")  # a is claimed first
    for w in (wf, other):
        await bundle.store.workflow_submit(w, now=T0)
    await bundle.store.heartbeat("old", ["build"], {}, now=T0)  # stale from T0 + 30
    await bundle.worker("w", now=T0)
    await run_node(bundle, "w", T0 + 1, '"A"')  # build waits from T0 + 1
    skip = bundle.store.workflow_skip_absent
    assert await skip(60.0, 30.0, now=T0 + 40) == []  # waited 39 s of 60
    await bundle.worker("w", now=T0 + 100)
    assert await skip(60.0, 30.0, now=T0 + 100) == [wf.nodes[1].job_id]
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert statuses(view) == {"a": "succeeded", "build": "skipped", "report": "skipped"}
    assert view.nodes[1].reason == ("worker_absent: no live worker with role build for 99s "
                                    "(wait 60s)")
    assert view.status == "partial" and view.nodes[2].reason is not None
    assert (await bundle.store.workflow_get(other.workflow_id)).status == "running"
    await bundle.worker("w", now=T0 + 200)
    assert await skip(60.0, 30.0, now=T0 + 200) == []  # `solo`'s role has a live worker
    assert await skip(60.0, 30.0, now=T0 + 231) == [other.nodes[0].job_id]  # not any more
