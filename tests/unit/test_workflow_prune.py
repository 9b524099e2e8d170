"""Workflow lifecycle on a FakeClock: retention keeps a graph whole until it has ended, and
the summary gives every ended node its reason (and a retried one none)."""

from __future__ import annotations

import os
import sqlite3

from coordd import cas
from coordd.wire.protocol import ArtifactRef, Complete, JobId
from coordd.wire.workflows import ListWorkflows, WorkflowId
from tests.unit.test_workflows import _convert, run_node



def stored_artifact(bundle) -> ArtifactRef:
    """A 5-byte file in coordd's artifact store, as a worker on its host writes it."""
    src = os.path.join(os.path.dirname(bundle.db_path), "result.bin")
    with open(src, "wb") as fh:
        fh.write(b"cdcdc")
    f = cas.store_file(bundle.coord.artifact_dir, src)
    return ArtifactRef(sha256=f.sha256, size=f.size, path=f.path)


def fan_in():
    """a (fast) and c (slow) -> b, which needs both."""
    return _convert({"name": "fan", "nodes": [
        {"name": "a", "kind": "k", "required_role": "cpu"},
        {"name": "c", "kind": "k", "required_role": "slow"},
        {"name": "b", "kind": "k", "required_role": "cpu", "needs": ["a", "c"]}]})


async def test_prune_keeps_nodes_of_a_running_workflow(make_bundle):
    bundle = await make_bundle(retention_s=5.0, workflow_absent_wait_s=3600)
    await bundle.worker("w", roles=["cpu"])
    await bundle.worker("s", roles=["slow"])
    sub = await bundle.coord.workflow_submit(fan_in())
    got = await bundle.claim("w")
    assert got.job.job_id == sub.jobs["a"]
    art = stored_artifact(bundle)
    await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id="w",
                                         token=got.lease.token, result={"a": 1}, artifact=art))
    slow = await bundle.claim("s", lease_s=600)
    assert slow.job.job_id == sub.jobs["c"]
    bundle.clock.advance(15)  # a ended 15 s ago (> retention); c still runs
    assert (await bundle.coord.status()).prunable == 0
    assert (await bundle.coord.prune()).pruned == 0
    await bundle.coord.flows.tick()
    a = await bundle.coord.get_job(JobId(job_id=sub.jobs["a"]))
    assert a.status == "succeeded" and a.artifact == art
    await bundle.coord.complete(Complete(job_id=slow.job.job_id, worker_id="s",
                                         token=slow.lease.token, result={"c": 1}))
    await bundle.worker("w", roles=["cpu"])
    job, _ = await run_node(bundle, "w", {"b": 1})
    assert job.job_id == sub.jobs["b"]
    assert job.payload["inputs"] == {"a": {"a": 1}, "c": {"c": 1}}
    assert job.payload["input_artifacts"]["a"]["sha256"] == art.sha256
    assert "missing_inputs" not in job.payload
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "succeeded" and wf.summary["succeeded"] == ["a", "c", "b"]
    # ended now: its nodes (a too, long past its own retention) wait for the workflow's
    bundle.clock.advance(4)
    assert (await bundle.coord.prune()).pruned == 0
    await bundle.coord.flows.tick()
    assert len((await bundle.coord.workflow_list(ListWorkflows())).workflows) == 1
    bundle.clock.advance(2)
    assert (await bundle.coord.status()).prunable == 3
    res = await bundle.coord.prune()
    assert (res.pruned, res.artifacts) == (3, 1)
    await bundle.coord.flows.tick()
    assert (await bundle.coord.workflow_list(ListWorkflows())).workflows == []
    with sqlite3.connect(bundle.db_path) as conn:
        assert conn.execute("SELECT count(*) FROM workflow_edges").fetchone()[0] == 0
    assert (await bundle.coord.check()) == {"quick_check": "ok", "foreign_key_violations": 0,
                                            "invariants": []}


async def test_prune_keeps_a_reopened_workflow_whole(make_bundle):
    """A workflow reopened by `retry` runs again: none of its old nodes are pruned."""
    bundle = await make_bundle(retention_s=5.0, workflow_absent_wait_s=10)
    sub = await bundle.coord.workflow_submit(fan_in())
    await bundle.worker("w", roles=["cpu"])
    await run_node(bundle, "w", {"a": 1})
    bundle.clock.advance(11)  # nobody offers `slow`: c skipped, b follows
    await bundle.worker("w", roles=["cpu"])
    assert (await bundle.coord.flows.tick())[0] == 1
    assert (await bundle.coord.workflow_get(
        WorkflowId(workflow_id=sub.workflow_id))).status == "partial"
    await bundle.worker("s", roles=["slow"])
    assert (await bundle.coord.retry(JobId(job_id=sub.jobs["c"]))).status == "waiting"
    bundle.clock.advance(60)
    assert (await bundle.coord.prune()).pruned == 0
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert [n.status for n in wf.nodes] == ["succeeded", "waiting", "blocked"]


async def test_summary_reasons_for_cancel_and_no_stale_reason_after_retry(bundle):
    """Every cancelled node has a reason in the summary; a retried node shows none."""
    from coordd.wire.protocol import Fail
    await bundle.worker("w", roles=["cpu"])
    sub = await bundle.coord.workflow_submit(fan_in())  # a, c waiting; b blocked
    got = await bundle.claim("w")  # a running
    wf = await bundle.coord.workflow_cancel(WorkflowId(workflow_id=sub.workflow_id))
    await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id="w",
                                         token=got.lease.token, result={}))
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "cancelled"
    reasons = {c["node"]: c["reason"] for c in wf.summary["cancelled"]}
    assert reasons == {"a": "cancelled before completion", "c": "cancelled by admin",
                       "b": "cancelled by admin"}
    assert (await bundle.coord.retry(JobId(job_id=sub.jobs["a"]))).status == "waiting"
    a = await bundle.coord.get_job(JobId(job_id=sub.jobs["a"]))
    assert a.status == "waiting" and a.last_error is None
    await bundle.worker("w", roles=["cpu"])
    got = await bundle.claim("w")
    await bundle.coord.fail(Fail(job_id=got.job.job_id, worker_id="w", token=got.lease.token,
                                 error="boom", retryable=False))
    assert (await bundle.coord.retry(JobId(job_id=sub.jobs["a"]))).status == "waiting"
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert [(n.name, n.status, n.reason) for n in wf.nodes][0] == (  # why it waits, not "boom"
        "a", "waiting", "runnable: waiting for a worker to claim it")
