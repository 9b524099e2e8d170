"""PostgresStore's workflows (coordd.store.api_workflows): a graph stored whole, its nodes
queued as their dependencies end, settled in the transaction of every node's end.

The decisions are coordd.rules.transitions' (settle, cancel, lost_lease, complete), the views
coordd.service.workflows', the checks of a repeated key and the node events
coordd.store.workflows': this module holds the statements (workflow_sql) and the order
they run in. The rule not to break: every transaction that changes a workflow node locks
the workflow's row first (`lock_of_job`), then the node's; settle runs only under that
lock (two nodes ending at once would otherwise each miss the other's end). The batched
complete and the one-statement reaper leave workflow nodes to this module.
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.rules import transitions as tr
from coordd.rules.workflow_views import workflow_view, workflow_views
from coordd.wire.workflows import WorkflowList, WorkflowSubmitResult, WorkflowView
from coordd.store import dumps, lenient_json
from coordd.store import workflows as wstore
from coordd.store.postgres import apply, sql
from coordd.store.postgres import workflow_sql as wsql

SETTLE_SWEEP_LIMIT = wstore.SETTLE_SWEEP_LIMIT
ABSENT_LIMIT = 1000  # nodes one worker_absent round skips at most (SQLite's skip_absent)


async def lock_of_job(conn: Any, job_id: str) -> str | None:
    """Lock the workflow of `job_id` (FOR UPDATE, until the transaction ends); its id, or
    None when the job is no node (or does not exist). Call it before locking the job."""
    return await conn.fetchval(wsql.SQL_LOCK_OF_JOB, job_id)


async def lock_of_worker(conn: Any, worker_id: str) -> list[str]:
    """Lock the workflows of the nodes `worker_id` holds (FOR UPDATE, in id order, until
    the transaction ends) and return their ids: call it before ending the worker's leases,
    then `settle` each."""
    return [r[0] for r in await conn.fetch(wsql.SQL_LOCK_OF_WORKER, worker_id)]


async def is_node(conn: Any, job_id: str) -> bool:
    """Whether `job_id` is a workflow's node (no lock taken)."""
    return await conn.fetchval(wsql.SQL_IS_NODE, job_id) is not None


# ---------------------------------------------------------------- submit


async def insert_workflow(conn: Any, now: float | None, wf: wstore.NewWorkflow
                          ) -> WorkflowSubmitResult:
    """Insert the workflow row, every node (blocked when it has dependencies) with its
    event, and every edge, in one transaction; a repeated idempotency key with the same
    graph returns the stored workflow (created False). Raises: errors.InvalidState (the
    key was used for another graph)."""
    async with conn.transaction():
        wid = await conn.fetchval(wsql.SQL_INSERT_WORKFLOW, now, wf.workflow_id, wf.name,
                                  wf.idempotency_key, wf.schedule_id, wf.spec_sha256)
        if wid is None:
            wid, sha = await conn.fetchrow(wsql.SQL_WORKFLOW_BY_KEY, wf.idempotency_key)
            wstore.check_repeat(wf, wid, sha)
            ids = {r[0]: r[1] for r in await conn.fetch(wsql.SQL_NODE_IDS, wid)}
            return WorkflowSubmitResult(workflow_id=wid, created=False, jobs=ids)
        nodes = wf.nodes
        enqueued = [wstore.node_enqueued(wf, n) for n in nodes]
        await conn.execute(
            wsql.SQL_INSERT_NODES, now, wid, [n.job_id for n in nodes],
            [n.kind for n in nodes], [n.required_role for n in nodes],
            [n.priority for n in nodes], [dumps(n.payload) for n in nodes],
            [t.to_status for t, _ in enqueued], [n.max_attempts for n in nodes],
            [n.max_runtime_s for n in nodes], [n.name for n in nodes],
            [reason for _, reason in enqueued], [n.gates_json for n in nodes],
            [n.result_schema for n in nodes])
        ids = {n.name: n.job_id for n in nodes}
        edges = [(n.job_id, ids[dep], policy) for n in nodes for dep, policy in n.needs]
        if edges:
            await conn.execute(wsql.SQL_INSERT_EDGES, *(list(col) for col in zip(*edges)))
    return WorkflowSubmitResult(workflow_id=wid, created=True, jobs=ids)


# ---------------------------------------------------------------- settle


async def settle(conn: Any, now: float | None, workflow_id: str | None,
                 touch: bool = True) -> str | None:
    """Move a workflow forward as far as its nodes' states allow, as
    coordd.store.workflows.settle does on SQLite (coordd.rules.transitions.settle decides);
    return its status if it ended now. Runs in the caller's transaction, which holds the
    workflow's lock. `workflow_id` None (the job was no node): nothing."""
    if workflow_id is None:
        return None
    nodes = [tr.Node(*r) for r in await conn.fetch(wsql.SQL_SETTLE_NODES, workflow_id)]
    plan = tr.settle(nodes, [tuple(r) for r in await conn.fetch(wsql.SQL_EDGES, workflow_id)])
    promoted = [s for s in plan.steps if s.t is tr.PROMOTED]
    payloads: dict[str, Any] = {}
    results: dict[str, Any] = {}
    if promoted:
        payloads = {r[0]: r[1] for r in await conn.fetch(
            wsql.SQL_PAYLOADS, [s.job_id for s in promoted])}
        deps = sorted({d for s in promoted for _, d in s.inputs})
        results = {r[0]: tuple(r)[1:] for r in await conn.fetch(wsql.SQL_DEP_RESULTS, deps)}
    for step in plan.steps:
        if step.t is tr.SKIPPED_DEP:
            await skip(conn, now, step.job_id, step.t, step.reason)
            continue
        inputs = []
        for name, dep_id in step.inputs:
            result_json, a_sha, a_size, a_path = results[dep_id]
            inputs.append((name, lenient_json(result_json),
                           {"sha256": a_sha, "size": a_size, "path": a_path} if a_sha else None))
        payload = tr.node_payload(lenient_json(payloads[step.job_id], {}), inputs, step.missing)
        await conn.execute(wsql.SQL_PROMOTE, now, step.job_id, dumps(payload))
        await conn.execute(sql.SQL_EVENT, now, step.job_id, None, step.t.from_status,
                           step.t.to_status, step.reason)
    if plan.status is None:
        if touch or plan.steps:
            await conn.execute(wsql.SQL_TOUCH_WORKFLOW, now, workflow_id)
        return None
    return await conn.fetchval(wsql.SQL_FINISH_WORKFLOW, now, workflow_id, plan.status,
                               dumps(plan.summary))


async def skip(conn: Any, now: float | None, job_id: str, t: tr.Transition,
               reason: str) -> bool:
    """End a blocked or waiting node `skipped` with `reason`; False if it had moved on."""
    if await conn.fetchval(wsql.SQL_SKIP, now, job_id, reason) is None:
        return False
    await conn.execute(sql.SQL_EVENT, now, job_id, None, t.from_status, t.to_status, reason)
    return True


async def settle_running(conn: Any, now: float | None) -> int:
    """Settle every running workflow, each in its own transaction under its lock (the
    backstop sweep); return how many ended."""
    ended = 0
    for (wid,) in await conn.fetch(wsql.SQL_RUNNING_WORKFLOWS, SETTLE_SWEEP_LIMIT):
        async with conn.transaction():
            if await conn.fetchval(wsql.SQL_LOCK, wid) is not None:
                ended += await settle(conn, now, wid, touch=False) is not None
    return ended


async def skip_absent(conn: Any, now: float | None, wait_s: float, stale_s: float,
                      limit: int = ABSENT_LIMIT) -> list[str]:
    """Skip (`worker_absent`, coordd.rules.transitions.SKIPPED_ABSENT) waiting workflow nodes
    that waited over `wait_s` while no worker with a heartbeat within `stale_s`
    advertised their role, as coordd.store.workflows.skip_absent does on SQLite; one
    transaction per workflow, its row locked first, then its nodes skipped (each
    re-checked: it may have been claimed meanwhile) and the workflow settled. Returns
    the skipped job ids."""
    by_workflow: dict[str, list[tuple[str, str, float]]] = {}
    for job_id, wid, role, waited in await conn.fetch(wsql.SQL_ABSENT, now, wait_s,
                                                      stale_s, limit):
        by_workflow.setdefault(wid, []).append((job_id, role, waited))
    skipped: list[str] = []
    for wid, nodes in by_workflow.items():
        async with conn.transaction():
            if await conn.fetchval(wsql.SQL_LOCK, wid) is None:
                continue
            t = tr.SKIPPED_ABSENT
            for job_id, role, waited in nodes:
                reason = tr.absent_reason(role, waited, wait_s)
                if await conn.fetchval(wsql.SQL_SKIP_ABSENT, now, job_id, wait_s,
                                       reason) is None:
                    continue
                await conn.execute(sql.SQL_EVENT, now, job_id, None, t.from_status,
                                   t.to_status, reason)
                skipped.append(job_id)
            await settle(conn, now, wid)
    return skipped


# ---------------------------------------------------------------- node ends


async def reap_nodes(conn: Any, now: float | None, limit: int) -> tuple[int, int]:
    """End up to `limit` expired leases of workflow nodes, one transaction each (the
    workflow locked first), as coordd.rules.transitions.lost_lease decides; a node that ended
    (attempts spent, a requested cancel) settles its workflow there. Returns (ended
    leases, jobs requeued)."""
    n = requeued = 0
    for (job_id,) in await conn.fetch(wsql.SQL_EXPIRED_NODES, now, limit):
        async with conn.transaction():
            wid = await lock_of_job(conn, job_id)
            row = await conn.fetchrow(wsql.SQL_END_EXPIRED, now, job_id)
            if row is None:  # renewed, ended or reaped meanwhile
                continue
            worker_id, attempts, max_attempts, cancel_requested, t = row
            d = tr.lost_lease(worker_id, attempts, max_attempts, cancel_requested,
                              tr.LEASE_EXPIRED, t)
            to = d.t.to_status
            if to == tr.WAITING:
                await conn.execute(sql.SQL_TO_WAITING, now, job_id, d.last_error, d.run_at)
                requeued += 1
            else:
                await conn.execute(sql.SQL_TO_TERMINAL, now, job_id, to, d.last_error)
            await conn.execute(sql.SQL_EVENT, now, job_id, worker_id, d.t.from_status, to,
                               d.reason)
            if to in tr.NODE_TERMINAL:
                await settle(conn, now, wid)
        n += 1
    return n, requeued


async def dead_letter_taken(conn: Any, now: float | None, job_id: str, worker_id: str,
                            d: tr.Decision) -> None:
    """End `failed` a job a claim just took whose stored data does not decode
    (sql.SQL_DEAD_LETTER_TAKEN), settling its workflow in the same transaction."""
    async with conn.transaction():
        wid = await lock_of_job(conn, job_id)
        await conn.execute(sql.SQL_DEAD_LETTER_TAKEN, now, job_id, worker_id, d.last_error,
                           d.reason)
        await settle(conn, now, wid)


# ---------------------------------------------------------------- cancel, reopen


async def cancel_workflow(conn: Any, now: float | None, workflow_id: str) -> int:
    """Cancel every node not yet ended (coordd.rules.transitions.cancel: blocked and waiting at
    once, running by request), then settle; return how many. Raises: errors.NotFound."""
    async with conn.transaction():
        if await conn.fetchval(wsql.SQL_LOCK, workflow_id) is None:
            raise errors.NotFound(f"workflow {workflow_id} not found")
        rows = await conn.fetch(wsql.SQL_OPEN_NODES, workflow_id)
        for job_id, status in rows:
            d = tr.cancel(status, job_id)
            if d is not None:
                await apply.apply(conn, now, job_id, None, d)
        await settle(conn, now, workflow_id)
    return len(rows)


async def reopen(conn: Any, now: float | None, job_id: str,
                 workflow_id: str | None) -> str | None:
    """After `retry` of a workflow node, as coordd.store.workflows.reopen on SQLite: the
    workflow runs again, nodes skipped because of this one (and so on down) are blocked
    again, the node itself waits for its dependencies if it has any. Returns the node's
    status after (None: no workflow). The caller holds the workflow's lock."""
    if workflow_id is None:
        return None
    if await conn.fetchval(wsql.SQL_HAS_DEPS, job_id) is not None \
            and await conn.fetchval(wsql.SQL_REBLOCK, job_id) is not None:
        t = tr.REBLOCKED
        await conn.execute(sql.SQL_EVENT, now, job_id, None, t.from_status, t.to_status,
                           "retried: waits for its dependencies")
    todo = [job_id]
    while todo:
        for (dep,) in await conn.fetch(wsql.SQL_SKIPPED_DEPENDENTS, todo.pop()):
            if await conn.fetchval(wsql.SQL_UNSKIP, now, dep) is not None:
                t = tr.UNSKIPPED
                await conn.execute(sql.SQL_EVENT, now, dep, None, t.from_status,
                                   t.to_status, f"dependency {job_id} retried")
                todo.append(dep)
    await conn.execute(wsql.SQL_REOPEN_WORKFLOW, now, workflow_id)
    await settle(conn, now, workflow_id)
    return await conn.fetchval(wsql.SQL_STATUS, job_id)


# ---------------------------------------------------------------- reads


async def get_workflow(conn: Any, workflow_id: str) -> WorkflowView:
    """One workflow with every node (coordd.rules.workflow_views.workflow_view). Raises:
    NotFound."""
    row = await conn.fetchrow(wsql.SQL_GET_WORKFLOW, workflow_id)
    if row is None:
        raise errors.NotFound(f"workflow {workflow_id} not found")
    nodes = [tuple(r) for r in await conn.fetch(wsql.SQL_NODES, workflow_id)]
    edges = [tuple(r) for r in await conn.fetch(wsql.SQL_EDGES, workflow_id)]
    return workflow_view(tuple(row), nodes, edges)


async def list_workflows(conn: Any, status: str | None, limit: int) -> list[WorkflowView]:
    """Workflows newest first, with node counts by status."""
    rows = [tuple(r) for r in await conn.fetch(wsql.SQL_LIST_WORKFLOWS, status, limit)]
    counts: dict[str, dict[str, int]] = {}
    for wid, st, k in await conn.fetch(wsql.SQL_WORKFLOW_COUNTS, [r[0] for r in rows]):
        counts.setdefault(wid, {})[st] = k
    return workflow_views(rows, counts)


class PostgresWorkflows:
    """The workflow methods of PostgresStore (a mixin: it uses the store's `_conn`,
    `claims`, `store_requests` and `attach_limits`)."""

    _conn: Any
    claims: Any
    store_requests: Any
    attach_limits: Any

    async def workflow_submit(self, wf: wstore.NewWorkflow, *,
                              now: float | None = None) -> WorkflowSubmitResult:
        """Store a validated graph whole (insert_workflow), its nodes' resource requests
        and limits in the same transaction."""
        async with self._conn() as conn, conn.transaction():
            res = await insert_workflow(conn, now, wf)
            if res.created:
                await self.store_requests(conn, wf.nodes)
                await self.attach_limits(conn, wf.nodes)
        if res.created and any(n.gates_json is not None for n in wf.nodes):
            self.claims.gated = True  # claims judge per-job gates from now on
        return res

    async def workflow_get(self, workflow_id: str) -> WorkflowView:
        async with self._conn() as conn:
            return await get_workflow(conn, workflow_id)

    async def workflow_list(self, status: str | None, limit: int) -> WorkflowList:
        async with self._conn() as conn:
            return WorkflowList(workflows=await list_workflows(conn, status, limit))

    async def workflow_cancel(self, workflow_id: str, *,
                              now: float | None = None) -> WorkflowView:
        async with self._conn() as conn:
            await cancel_workflow(conn, now, workflow_id)
            return await get_workflow(conn, workflow_id)

    async def workflow_settle_running(self, *, now: float | None = None) -> int:
        async with self._conn() as conn:
            return await settle_running(conn, now)

    async def workflow_skip_absent(self, wait_s: float, stale_s: float, *,
                                   now: float | None = None) -> list[str]:
        """Skip, `worker_absent`, the waiting nodes no live worker can run (skip_absent);
        return their job ids."""
        async with self._conn() as conn:
            return await skip_absent(conn, now, wait_s, stale_s)


__all__ = ["PostgresWorkflows", "dead_letter_taken", "lock_of_job", "reap_nodes", "reopen",
           "settle", "skip_absent"]
