"""The store operations the one Coordinator serves its reads and its daemon with (issue
27), on both stores: id lookup, a job's workflow node, what explains a waiting job
(workers, states, requests, limits), ping, the restart grace, and the wake-ups of a
parked claim through `attach` (a Coordinator over each store)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.rules import resources
from coordd.clock import FakeClock
from coordd.wire.protocol import Claim, Enqueue, Heartbeat
from coordd.service import Coordinator
from coordd.store.sqlite.store import SQLiteStore
from tests.store.conftest import COOL, T0
from tests.store.test_conformance_limits import book, policy, ref
from tests.store.test_conformance_workflows import node, plan


async def test_ids_are_resolved_alike(bundle):
    job_id = await bundle.enqueue()
    assert await bundle.store.resolve_id("job", job_id) == job_id
    with pytest.raises(errors.NotFound, match=f"job {job_id}z not found"):
        await bundle.store.resolve_id("job", job_id + "z")
    with pytest.raises(errors.BadRequest, match="job_id must not be empty"):
        await bundle.store.resolve_id("job", "")
    wf = plan(bundle, [node("a")])
    await bundle.store.workflow_submit(wf, now=T0)
    assert await bundle.store.resolve_id("workflow", wf.workflow_id) == wf.workflow_id


async def test_a_jobs_workflow_node_and_its_dependencies(bundle):
    plain = await bundle.enqueue()
    assert await bundle.store.job_node(plain) == (None, None, None, [])
    wf = plan(bundle, [node("a"), node("b"), node("c", "a", {"node": "b", "policy": "run"})])
    ids = (await bundle.store.workflow_submit(wf, now=T0)).jobs
    got = await bundle.store.job_node(ids["c"])
    assert (got[0], got[1], got[2]) == (wf.workflow_id, "c", None)
    assert [tuple(d) for d in got[3]] == [("a", "waiting", "skip"), ("b", "waiting", "run")]


async def test_what_explains_a_waiting_job(bundle):
    await bundle.worker("w1", roles=["gpu"])
    asks = bundle.job(role="gpu")
    asks.resources = resources.parse_request({"gpus": 1})
    await bundle.store.enqueue([asks], now=T0)
    plain = await bundle.enqueue()
    got = await bundle.store.explain_book(now=T0 + 1)
    assert [r[0] for r in got.rows] == ["w1"] and set(got.states) == {"w1"}
    requests, grants = await bundle.store.resource_book([asks.job_id, plain])
    assert requests == {asks.job_id: asks.resources} and grants == {}
    assert await bundle.store.resource_book([plain]) == ({}, {})  # grants read only if asked


async def test_a_full_limit_is_the_reason_on_both_stores(bundle):
    lb = book(gpu={"concurrency": 1})
    bundle.policy = policy(lb)
    first, second = [await bundle.enqueue(limits=[("gpu", 1)]) for _ in range(2)]
    await bundle.worker("w1")
    assert (await bundle.claim("w1", now=T0 + 1)).job.job_id == first
    why = await bundle.store.limit_reasons([(second, 2)], lb, now=T0 + 2)
    _, alone = await bundle.store.job_limits(second, 2, True, lb, now=T0 + 2)
    assert why == {second: alone} and "gpu" in alone
    assert await bundle.store.limit_reasons([(second, 2)], book(), now=T0 + 2) == {}


async def test_ping_and_the_restart_grace(bundle):
    await bundle.store.ping()
    await bundle.worker("w1")
    await bundle.enqueue()
    got = await bundle.claim("w1", now=T0, lease_s=30)
    assert await bundle.store.restart_grace(now=T0 + 100) == 1  # past its expiry: extended
    renewed = await bundle.store.renew(ref(got, "w1"), 30, now=T0 + 110)
    assert renewed.expires_at == T0 + 140


@pytest.fixture(params=["sqlite", "postgres"])
async def coord(request: Any, tmp_path: Any) -> Any:
    """A started Coordinator over a fresh store of each kind (hooks attached first)."""
    clock = FakeClock(T0)
    if request.param == "sqlite":
        st: Any = SQLiteStore(str(tmp_path / "c.db"), clock)
    else:
        from coordd.store.postgres import PostgresStore
        st = PostgresStore(request.getfixturevalue("pg_dsn"))
    c = Coordinator(st, config_mod.load(None), clock)
    await c.start()
    if request.param == "postgres":
        await st.truncate()
    try:
        yield c
    finally:
        await c.close()


async def test_a_parked_claim_is_woken_by_the_enqueue(coord):
    await coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu"], readings=COOL))
    parked = asyncio.ensure_future(coord.claim(Claim(worker_id="w1", lease_s=30, wait_s=60)))
    await asyncio.sleep(0.05)
    assert not parked.done() and coord.push.parked == 1
    job = await coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=2, payload={}))
    got = await asyncio.wait_for(parked, 5)  # the FakeClock never reaches the wait's end
    assert got.job is not None and got.job.job_id == job.job_id
    assert coord.push.parked == 0


async def test_an_enqueue_error_names_its_job_in_a_batch(bundle):
    await bundle.store.enqueue([bundle.job(idempotency_key="k", request_sha256="a")], now=T0)
    batch = [bundle.job(), bundle.job(idempotency_key="k", request_sha256="b")]
    with pytest.raises(errors.InvalidState, match=r"^jobs\[1\]: idempotency key 'k' is taken"):
        await bundle.store.enqueue(batch, indexed=True, now=T0)
    with pytest.raises(errors.InvalidState, match=r"^idempotency key 'k' is taken"):
        await bundle.store.enqueue(batch[1:], now=T0)
    assert (await bundle.store.status(60.0, now=T0)).jobs["waiting"] == 1  # all or none


async def test_ids_are_resolved_by_prefix_alike(bundle):
    """`show PREFIX` / `workflow show PREFIX`: the one id that starts with it, an ambiguous
    prefix named as such, on both stores."""
    one, two = await bundle.enqueue(), await bundle.enqueue()
    common = next(i for i in range(len(one)) if one[i] != two[i])
    assert await bundle.store.resolve_id("job", one[:common + 1]) == one
    assert await bundle.store.resolve_id("job", two[:common + 1]) == two
    if common:
        with pytest.raises(errors.BadRequest, match="ambiguous"):
            await bundle.store.resolve_id("job", one[:common])
    with pytest.raises(errors.NotFound, match="no job id starts with it"):
        await bundle.store.resolve_id("job", "zz")
    wf = plan(bundle, [node("a")])
    await bundle.store.workflow_submit(wf, now=T0)
    assert await bundle.store.resolve_id("workflow", wf.workflow_id[:-3]) == wf.workflow_id
