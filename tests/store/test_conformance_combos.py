"""Admission in combination over both stores: resource requests beside fleet limits,
priority aging and per-job gates, on one job or one workflow node, judged in one claim
as SQLite's coordd.store.sqlite.claims._Judge does (gates, then resources, then limits). The same
bodies, the same replies, on SQLite and PostgreSQL, `now` pinned."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from coordd.rules import gates
from coordd.rules import limits
from coordd.rules import resources
from coordd.rules import results
from coordd.rules.resources import Request
from coordd.store import workflows as wstore
from coordd.store.sqlite.store import SQLiteStore
from tests.store.conftest import COOL, T0, Bundle
from tests.store.test_conformance_limits import book, policy, ref

GPU = {"gpu_devices": [{"index": 0, "memory_total_mb": 24000.0, "memory_used_mb": 0.0}],
       "ram_mb": 64000}
BATTERY = {**COOL, **GPU, "on_battery": True}
# P3's own gates say mains power; these let a P3 job run on battery
ON_BATTERY_OK = '{"require_mains": false, "power_unknown": "mains"}'
VALID = msgspec.json.encode({"claims": [{"text": "t", "label": "opinion"}]}).decode()


def admitting(lb: Any = None, aging_s: float = 0.0) -> Any:
    """The claim policy of a coordd whose jobs asked for resources (coordd.service.intake sets
    `resources_seen`; the PostgreSQL store knows it from its own tables)."""
    pol = policy(lb, aging_s)
    pol.resources_seen = True
    return pol


async def gpu_worker(bundle: Bundle, worker_id: str, now: float = T0, **readings: Any) -> None:
    await bundle.store.heartbeat(worker_id, ["cpu"], {**COOL, **GPU, **readings}, now=now)


async def reopen(bundle: Bundle, request: Any, tmp_path: Any) -> None:
    """Close the store and open it again on the same database (a coordd restart); the
    caller closes the new one."""
    await bundle.store.close()
    if bundle.kind == "sqlite":
        from coordd.clock import FakeClock
        bundle.store = SQLiteStore(str(tmp_path / "store.db"), FakeClock(T0))
    else:
        from coordd.store.postgres import PostgresStore
        bundle.store = PostgresStore(request.getfixturevalue("pg_dsn"))
    await bundle.store.start()


async def test_limits_defined_a_job_asking_resources_and_naming_no_limit_is_granted(bundle):
    """`[limits.*]` in the config does not stop a job asking for a GPU that names no
    limit; one asking both holds the GPU and the limit's unit; each refusal says which."""
    lb = book(api={"concurrency": 1})
    bundle.policy = admitting(lb)
    gpu_only = await bundle.enqueue(priority=1, resources=Request(gpus=1))
    both = await bundle.enqueue(priority=2, resources=Request(gpus=1), limits=[("api", 1)])
    api_only = await bundle.enqueue(priority=3, limits=[("api", 1)])
    await gpu_worker(bundle, "g")
    first = await bundle.claim("g", now=T0 + 1)
    assert (first.job.job_id, first.job.gpu_ids) == (gpu_only, [0])
    second = await bundle.claim("g", now=T0 + 2)  # `both` waits for the GPU: api_only runs
    assert (second.job.job_id, second.job.gpu_ids) == (api_only, None)
    none = await bundle.claim("g", now=T0 + 3)
    assert none.job is None and none.reasons == [resources.RESOURCES]
    await bundle.store.complete(ref(first, "g"), '"ok"', now=T0 + 4)
    none = await bundle.claim("g", now=T0 + 5)  # the GPU is free, the api unit is not
    assert none.job is None and none.reasons == [limits.LIMIT_REFUSED]
    assert none.detail == "limit api: 1/1 running"
    await bundle.store.complete(ref(second, "g"), '"ok"', now=T0 + 6)
    got = await bundle.claim("g", now=T0 + 7)
    assert (got.job.job_id, got.job.gpu_ids) == (both, [0])
    views, _ = await bundle.store.limit_views(lb, ["api"], True, now=T0 + 7)
    assert views[0].used == 1 and [h.job_id for h in views[0].holders] == [both]


async def test_per_job_gates_once_resources_were_asked_also_after_a_restart(
        bundle, request, tmp_path):
    """A job with its own gates is stored and claimed by its gates after another job
    asked for resources, and again after the store is opened anew."""
    bundle.policy = admitting()
    big = await bundle.enqueue(priority=3, resources=Request(gpus=1))
    gated = bundle.job(priority=3)
    gated.gates_json = ON_BATTERY_OK
    await bundle.store.enqueue([gated], now=T0)
    await gpu_worker(bundle, "g", on_battery=True)
    got = await bundle.claim("g", now=T0 + 1)
    assert got.job.job_id == gated.job_id  # `big` keeps P3's mains gate
    none = await bundle.claim("g", now=T0 + 2)
    assert none.job is None and none.reasons == [gates.ON_BATTERY], big
    await reopen(bundle, request, tmp_path)
    try:
        again = bundle.job(priority=3)
        again.gates_json = ON_BATTERY_OK
        await bundle.store.enqueue([again], now=T0 + 3)
        await gpu_worker(bundle, "g", now=T0 + 3, on_battery=True)
        got = await bundle.claim("g", now=T0 + 4)
        assert got.job.job_id == again.job_id
        await gpu_worker(bundle, "g", now=T0 + 5)  # on mains: the GPU job's turn
        got = await bundle.claim("g", now=T0 + 5)
        assert (got.job.job_id, got.job.gpu_ids) == (big, [0])
    finally:
        await bundle.store.close()  # the fixture closes the store it opened


async def test_aging_resources_and_a_limit_in_one_claim(bundle):
    """Aging orders the candidates (an old P3 passes a young P1), resources and limits
    judge each: the old P3 asking a GPU and a limit unit is taken with both; the P1 then
    waits for the GPU, and a P2 gated job with its own gates backfills."""
    lb = book(api={"concurrency": 1})
    bundle.policy = admitting(lb, aging_s=60.0)
    old = await bundle.enqueue(priority=3, resources=Request(gpus=1), limits=[("api", 1)])
    young = await bundle.enqueue(now=T0 + 150, priority=1, resources=Request(gpus=1))
    gated = bundle.job(priority=2)
    gated.gates_json = '{"max_temperature_c": 99}'
    await bundle.store.enqueue([gated], now=T0 + 160)
    await gpu_worker(bundle, "g", now=T0 + 200)
    got = await bundle.claim("g", now=T0 + 200)
    assert (got.job.job_id, got.job.gpu_ids) == (old, [0])
    got2 = await bundle.claim("g", now=T0 + 201)
    assert (got2.job.job_id, got2.job.gpu_ids) == (gated.job_id, None)
    none = await bundle.claim("g", now=T0 + 202)
    assert none.job is None and none.reasons == [resources.RESOURCES], young
    views, _ = await bundle.store.limit_views(lb, ["api"], True, now=T0 + 202)
    assert [h.job_id for h in views[0].holders] == [old]


async def test_a_workers_kind_defaults_are_requests_with_no_job_asking(bundle):
    """A worker's heartbeat may name a default request per kind (`kind_resources`): it
    applies on both stores even before any job asked for resources itself."""
    bundle.policy = policy()
    a = await bundle.enqueue(priority=2, kind="embed")
    b = await bundle.enqueue(priority=2, kind="embed")
    await gpu_worker(bundle, "g", kind_resources={"embed": {"gpus": 1}})
    got = await bundle.claim("g", now=T0 + 1)
    assert (got.job.job_id, got.job.gpu_ids) == (a, [0])
    none = await bundle.claim("g", now=T0 + 2)
    assert none.job is None and none.reasons == [resources.RESOURCES], b


async def test_one_workers_concurrent_claims_never_share_its_gpu(bundle):
    """Eight claims of one worker with one GPU at once: one job is granted the GPU, the
    others are refused `resources` (on PostgreSQL, the worker's claim lock)."""
    bundle.policy = admitting()
    for _ in range(4):
        await bundle.enqueue(priority=2, resources=Request(gpus=1))
    await gpu_worker(bundle, "g")
    got = await asyncio.gather(*(bundle.claim("g", now=T0 + 1) for _ in range(8)))
    taken = [g for g in got if g.job is not None]
    assert len(taken) == 1 and taken[0].job.gpu_ids == [0]
    assert all(g.reasons == [resources.RESOURCES] for g in got if g.job is None)


def _node(bundle: Bundle, name: str, *needs: str, **kw: Any) -> wstore.NewNode:
    return wstore.NewNode(job_id=bundle.ids.new(T0), name=name, kind="k",
                          required_role="cpu", priority=kw.pop("priority", 2), payload={},
                          max_attempts=kw.pop("max_attempts", 3),
                          needs=[(d, "skip") for d in needs], **kw)


async def test_a_node_with_gates_resources_a_limit_and_a_result_schema(bundle):
    """A workflow node may carry all of them (examples/workflow.toml's `result_schema`
    among them): stored, claimed by its gates with its grant and its unit, a result
    that fails its schema spends the attempt, a valid one succeeds and the graph goes on."""
    lb = book(api={"concurrency": 1})
    bundle.policy = admitting(lb)
    a = _node(bundle, "a", priority=3, gates_json=ON_BATTERY_OK, resources=Request(gpus=1),
              limits=[("api", 1)], result_schema="claims")
    b = _node(bundle, "b", "a")
    wf = wstore.NewWorkflow(workflow_id=bundle.ids.new(T0), name="combo", nodes=[a, b])
    res = await bundle.store.workflow_submit(wf, now=T0)
    assert res.created and res.jobs == {"a": a.job_id, "b": b.job_id}
    await gpu_worker(bundle, "g", on_battery=True)
    got = await bundle.claim("g", now=T0 + 1)
    assert (got.job.job_id, got.job.gpu_ids) == (a.job_id, [0])
    views, _ = await bundle.store.limit_views(lb, ["api"], True, now=T0 + 1)
    assert [h.job_id for h in views[0].holders] == [a.job_id]
    bad = await bundle.store.complete(ref(got, "g"), '{"claims": 1}', now=T0 + 2)
    assert bad.status == "waiting" and bad.error.startswith("result_invalid (claims)")
    views, _ = await bundle.store.limit_views(lb, ["api"], True, now=T0 + 2)
    assert views[0].used == 0  # the unit went with the lease
    got = await bundle.claim("g", now=T0 + 3)
    assert (got.job.job_id, got.job.gpu_ids, got.job.attempts) == (a.job_id, [0], 2)
    done = await bundle.store.complete(ref(got, "g"), VALID, now=T0 + 4)
    assert done.status == "succeeded"
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert {n.name: n.status for n in view.nodes} == {"a": "succeeded", "b": "waiting"}
    nxt = await bundle.claim("g", now=T0 + 5)
    assert nxt.job.job_id == b.job_id and nxt.job.payload == {
        "inputs": {"a": msgspec.json.decode(results.check("claims", VALID))}}
    await bundle.store.complete(ref(nxt, "g"), '"ok"', now=T0 + 6)
    assert (await bundle.store.workflow_get(wf.workflow_id)).status == "succeeded"


async def test_a_node_failing_its_schema_on_its_last_attempt_ends_the_graph(bundle):
    """The last attempt's invalid result ends the node `failed` and settles its
    workflow in the same step: its dependent is skipped, the graph ends."""
    a = _node(bundle, "a", max_attempts=1, result_schema="claims")
    b = _node(bundle, "b", "a")
    wf = wstore.NewWorkflow(workflow_id=bundle.ids.new(T0), name="strict", nodes=[a, b])
    await bundle.store.workflow_submit(wf, now=T0)
    await bundle.worker("w")
    got = await bundle.claim("w", now=T0 + 1)
    bad = await bundle.store.complete(ref(got, "w"), '"not claims"', now=T0 + 2)
    assert bad.status == "failed" and bad.error.startswith("result_invalid")
    view = await bundle.store.workflow_get(wf.workflow_id)
    assert ({n.name: n.status for n in view.nodes}, view.status) == (
        {"a": "failed", "b": "skipped"}, "failed")


async def test_an_admitting_claim_of_a_worker_with_two_roles_keeps_claim_order(bundle):
    """The admission walk merges the worker's roles in claim order (priority, then
    queued_at): jobs of another role waiting ahead are never handed out nor in the way."""
    bundle.policy = admitting(book(api={"concurrency": 9}))
    for i in range(3):
        await bundle.enqueue(now=T0 + i, priority=1, role="other")
    order = [await bundle.enqueue(now=T0 + 10, priority=2, role="b"),
             await bundle.enqueue(now=T0 + 11, priority=2, role="a", limits=[("api", 1)]),
             await bundle.enqueue(now=T0 + 12, priority=2, role="b", resources=Request(gpus=1))]
    first = await bundle.enqueue(now=T0 + 13, priority=1, role="a")
    await bundle.store.heartbeat("g", ["a", "b"], {**COOL, **GPU}, now=T0 + 20)
    got = [await bundle.claim("g", now=T0 + 20) for _ in range(5)]
    assert [g.job.job_id if g.job else None for g in got] == [first, *order, None]


async def _counted(bundle: Bundle, now: float) -> tuple[dict[str, int], dict[str, int]]:
    """(jobs by status, waiting by priority) counted from every job's row."""
    from coordd.store.api import JobFilter
    jobs = (await bundle.store.list_jobs(JobFilter(limit=1000), now=now)).jobs
    by_status: dict[str, int] = {}
    waiting = {f"p{p}": 0 for p in range(4)}
    for j in jobs:
        by_status[j.status] = by_status.get(j.status, 0) + 1
        if j.status == "waiting":
            waiting[f"p{j.priority}"] += 1
    return by_status, waiting


async def test_status_counts_follow_every_kind_of_write(bundle, request, monkeypatch):
    """`status`'s job counts (kept by the writes on PostgreSQL, not counted by a scan)
    equal the jobs' rows after enqueues, claims, completes, retries, cancels, a workflow
    skipped and a reaped lease, also with writes from another store's sessions that
    have ended since (PostgreSQL folds their shards)."""
    jobs = [bundle.job(priority=p % 4) for p in range(8)]
    await bundle.store.enqueue(jobs, now=T0)
    wf = wstore.NewWorkflow(workflow_id=bundle.ids.new(T0), name="w", nodes=[
        _node(bundle, "a", max_attempts=1), _node(bundle, "b", "a")])
    await bundle.store.workflow_submit(wf, now=T0)
    await bundle.worker("w")
    got = [await bundle.claim("w", now=T0 + 1, lease_s=5.0) for _ in range(5)]
    await bundle.store.complete(ref(got[0], "w"), '"ok"', now=T0 + 2)
    await bundle.store.fail(ref(got[1], "w"), "again", True, lambda n: 0.0, now=T0 + 2)
    await bundle.store.fail(ref(got[2], "w"), "no", False, lambda n: 0.0, now=T0 + 2)
    await bundle.store.cancel(jobs[7].job_id, now=T0 + 3)
    await bundle.store.retry(got[2].job.job_id, now=T0 + 3)
    await bundle.store.reap(now=T0 + 20)  # got[3], got[4]: their leases expired
    await bundle.store.workflow_cancel(wf.workflow_id, now=T0 + 21)
    st = await bundle.store.status(30.0, now=T0 + 21)
    by_status, waiting = await _counted(bundle, T0 + 21)
    assert {k: v for k, v in st.jobs.items() if v} == by_status
    assert st.waiting_by_priority == waiting
    if bundle.kind != "postgres":
        return
    from coordd.store.postgres import PostgresStore
    other = PostgresStore(request.getfixturevalue("pg_dsn"), pool_min=1, pool_max=2)
    await other.start()  # the same tables, not emptied
    try:
        await other.enqueue([bundle.job(priority=1) for _ in range(3)], now=T0 + 22)
        await other.heartbeat("o", ["cpu"], COOL, now=T0 + 22)
        await other.claim("o", 30.0, bundle.policy, now=T0 + 22)
    finally:
        await other.close()
    from coordd.store.postgres import reads
    monkeypatch.setattr(reads, "COUNT_SHARD_ROWS_MAX", 0)  # fold at the next status
    for _ in range(2):
        st = await bundle.store.status(30.0, now=T0 + 23)
        by_status, waiting = await _counted(bundle, T0 + 23)
        assert {k: v for k, v in st.jobs.items() if v} == by_status
        assert st.waiting_by_priority == waiting
    async with bundle.store._conn() as conn:
        shards = {r[0] for r in await conn.fetch("SELECT DISTINCT shard FROM job_counts")}
        live = {r[0] for r in await conn.fetch("SELECT pid FROM pg_stat_activity")}
    assert shards <= live | {0} and sum(by_status.values()) == 13


async def test_concurrent_claimers_on_gpu_jobs_with_a_limit_and_gated_jobs(bundle, request):
    """4 one-GPU workers, each with 3 concurrent claimers (on PostgreSQL over two stores),
    on jobs asking the GPU (some also a limit of concurrency 2) and gated jobs asking
    nothing: a worker never runs two GPU jobs at once, the limit is never passed, every
    job succeeds once."""
    from coordd.store.postgres import PostgresStore
    lb = book(api={"concurrency": 2})
    bundle.policy = admitting(lb)
    stores = [bundle.store]
    try:
        gpu_jobs = {await bundle.enqueue(resources=Request(gpus=1),
                                         limits=[("api", 1)] if i % 2 else [])
                    for i in range(16)}
        limited = {j for i, j in enumerate(sorted(gpu_jobs)) if i % 2}
        gated = [bundle.job(priority=1) for _ in range(8)]
        for j in gated:
            j.gates_json = '{"max_temperature_c": 99}'
        await bundle.store.enqueue(gated, now=T0)
        if bundle.kind == "postgres":  # a store learns of requests and gates at its start
            other = PostgresStore(request.getfixturevalue("pg_dsn"), pool_min=1, pool_max=8)
            await other.start()
            stores.append(other)
        for w in range(4):
            await gpu_worker(bundle, f"g{w}")
        held: dict[str, set[str]] = {f"g{w}": set() for w in range(4)}
        peak = {"api": 0, "now": 0}
        done: list[str] = []

        async def claimer(n: int) -> None:
            wid, st = f"g{n % 4}", stores[n % len(stores)]
            for _ in range(3):
                got = await st.claim(wid, 30.0, bundle.policy, now=T0 + 1)
                if got.job is None:
                    await asyncio.sleep(0.01)
                    continue
                job_id = got.job.job_id
                if job_id in gpu_jobs:
                    assert got.job.gpu_ids == [0] and not held[wid], (wid, held[wid])
                    held[wid].add(job_id)
                if job_id in limited:
                    peak["now"] += 1
                    peak["api"] = max(peak["api"], peak["now"])
                await asyncio.sleep(0.005)
                held[wid].discard(job_id)
                peak["now"] -= job_id in limited
                res = await st.complete(ref(got, wid), '"ok"', now=T0 + 1)
                assert res.status == "succeeded"
                done.append(job_id)

        for _ in range(12):
            await asyncio.gather(*(claimer(n) for n in range(12)))
            if len(done) == 24:
                break
        assert sorted(done) == sorted([*gpu_jobs, *(j.job_id for j in gated)])
        assert peak["api"] <= 2
    finally:
        for st in stores[1:]:
            await st.close()
