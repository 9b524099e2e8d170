"""Workflows served by `coordd --store postgresql://` (issue 20): a real coordd process on
the session's throwaway cluster, a real coord-worker running the nodes, the workflow RPC
methods over the Unix socket. Skipped, with the reason, without asyncpg or the
PostgreSQL binaries."""

from __future__ import annotations

from typing import Any

import pytest

from coordd import errors
from coordd.client import Client
from tests.integration.test_pg_daemon import pg_db, rig  # noqa: F401 (fixtures)
from tests.integration.workerbench import until


def _node(name: str, *needs: str, **payload: Any) -> dict[str, Any]:
    return {"name": name, "kind": "m", "required_role": "cpu", "priority": 1,
            "payload": {"echo": name, **payload}, "needs": list(needs)}


async def _ended(c: Client, workflow_id: str, timeout: float = 60.0) -> Any:
    async def done() -> Any:
        wf = await c.workflow_get(workflow_id)
        return wf if wf.status != "running" else None
    return await until(done, timeout, f"workflow {workflow_id} ended")


async def test_workflows_on_postgres_over_the_socket(rig):
    a = rig.coordd("a")
    await a.wait_serving()
    async with Client(a.socket, timeout=10) as c:
        diamond = await c.workflow_submit({"name": "diamond", "idempotency_key": "d-1", "nodes": [
            _node("a"), _node("b", "a"), _node("c", "a"), _node("d", "b", "c")]})
        assert diamond.created and list(diamond.jobs) == ["a", "b", "c", "d"]
        again = await c.workflow_submit({"name": "diamond", "idempotency_key": "d-1", "nodes": [
            _node("a"), _node("b", "a"), _node("c", "a"), _node("d", "b", "c")]})
        assert (again.created, again.workflow_id) == (False, diamond.workflow_id)
        broken = await c.workflow_submit({"name": "broken", "nodes": [
            _node("a", exit=3), _node("b", "a")]})
        rig.worker("w1", [a.socket], slots=2, claim_wait_s=5)
        wf = await _ended(c, diamond.workflow_id)
        assert wf.status == "succeeded", wf
        d = next(n for n in wf.nodes if n.name == "d")
        assert d.result["echo"] == "d"
        d_job = await c.get_job(d.job_id)
        assert [e.to_status for e in d_job.events] == ["blocked", "waiting", "running",
                                                       "succeeded"]
        wf = await _ended(c, broken.workflow_id)
        assert wf.status == "failed"
        assert [(n.name, n.status, n.reason) for n in wf.nodes][1] == (
            "b", "skipped", "dependency_failed: a")
        # a node no worker can take waits; cancel ends the workflow at once
        stuck = await c.workflow_submit({"name": "stuck", "nodes": [
            {"name": "g", "kind": "m", "required_role": "gpu"}]})
        wf = await c.workflow_cancel(stuck.workflow_id)
        assert (wf.status, [n.status for n in wf.nodes]) == ("cancelled", ["cancelled"])
        listed = (await c.workflow_list()).workflows
        assert [w.name for w in listed] == ["stuck", "broken", "diamond"]
        assert [w.name for w in (await c.workflow_list(status="failed")).workflows] == ["broken"]
        # bad input: the SQLite path's checks and codes
        with pytest.raises(errors.BadRequest, match="dependency cycle"):
            await c.workflow_submit({"name": "loop", "nodes": [
                _node("x", "y"), _node("y", "x")]})
        with pytest.raises(errors.BadRequest, match="status must be one of"):
            await c.workflow_list(status="nope")
        ids = [w.workflow_id for w in listed]  # workflow show PREFIX
        one = diamond.workflow_id
        short = next(one[:n] for n in range(1, 17)
                     if not any(i != one and i.startswith(one[:n]) for i in ids))
        assert (await c.workflow_get(short, prefix=True)).workflow_id == one
        with pytest.raises(errors.NotFound, match="no workflow id starts with it"):
            await c.workflow_get("zz", prefix=True)
        added = await c.schedule_add("nightly", "0 3 * * *",
                                     {"name": "n", "nodes": [_node("a")]})
        assert added.created and added.name == "nightly"  # schedules: served (issue 28)
        assert (await c.status()).jobs["succeeded"] == 4


async def test_examples_workflow_and_resources_beside_limits_on_postgres(rig):
    """README's `coordctl workflow submit examples/workflow.toml` (a node with a result
    schema) is stored on PostgreSQL, and with `[limits.*]` in the config a job asking
    for resources and naming no limit is enqueued, as is a job with its own gates after
    it; a node with its own gates, resources and a limit too (issue 28)."""
    import tomllib
    from pathlib import Path
    rig.config_extra = "limits = { api = { concurrency = 2 } }\n"
    a = rig.coordd("a")
    await a.wait_serving()
    spec = tomllib.loads((Path(__file__).parents[2] / "examples" / "workflow.toml").read_text())
    async with Client(a.socket, timeout=10) as c:
        story = await c.workflow_submit(spec)
        assert story.created and list(story.jobs) == ["gather", "narrate", "build"]
        wf = await c.workflow_get(story.workflow_id)
        assert [n.status for n in wf.nodes] == ["waiting", "blocked", "blocked"]
        gpu = await c.enqueue(kind="m", required_role="gpu", payload={}, priority=1,
                              resources={"gpus": 1})
        gated = await c.enqueue(kind="m", required_role="cpu", payload={}, priority=3,
                                gates={"max_memory_pct": 30})
        assert (await c.get_job(gpu.job_id)).status == "waiting"
        assert (await c.get_job(gated.job_id)).status == "waiting"
        combo = await c.workflow_submit({"name": "combo", "nodes": [
            {**_node("g"), "gates": {"max_memory_pct": 30}, "resources": {"gpus": 1},
             "limits": ["api"], "result_schema": "claims"}]})
        assert combo.created
