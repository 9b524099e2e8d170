"""Workflows in the SQLite store: inserting a graph and applying the transitions
coordd.rules.transitions decides for it (settle, skip, reopen, cancel, prune); schema v5
is in coordd.store.workflow_schema, schedules in coordd.store.schedules, the reads in
coordd.store.workflow_reads.

A workflow is a row in `workflows` plus jobs (its nodes) that carry its `workflow_id` and
their node `name`, and `workflow_edges` (dependent -> dependency, with a policy). A node
with unmet dependencies is stored `blocked`, which no claim looks at: the claim path and
its partial index (`WHERE status = 'waiting'`) are untouched. `settle` promotes a blocked
node to `waiting` when every dependency has ended, in the same writer transaction as the
change that ended the last one (complete, fail, cancel, retry), so no crash can leave a
ready node stranded; a sweep in the maintenance loop settles every running workflow again
as a backstop (an expired lease's last attempt, or a claim-time dead letter, ends a job
outside those hooks: its workflow moves on within one maintenance round).

Like everything in coordd.store, these functions run inside the writer's transaction and
take `now` from coordd's clock.

Every statement's plan is pinned, not left to the planner's statistics (a stale
sqlite_stat1 once made the edge read scan every edge of every workflow): `INDEXED BY` the
index meant, `CROSS JOIN` for the join order, `NOT INDEXED` where only the primary key of
a WITHOUT ROWID table will do, and a unary `+` on a term that must not pick an index.
tests/unit/test_workflow_plans.py checks each plan with skewed statistics loaded.
"""

from __future__ import annotations

import sqlite3

from coordd import errors
from coordd.rules import transitions as tr
from coordd.wire.protocol import StatusResult
from coordd.jsontext import dumps, lenient_json
from coordd.store.jobs import cancel, event, retry
from coordd.store.resources import add_request
from coordd.store import limits as limit_store
from coordd.store.api_workflows import NewNode, NewWorkflow  # noqa: F401  (re-exported)
from coordd.store.workflow_reads import SQL_EDGES, workflow_row


# Statuses a node can end in; a workflow is over when every node is in one of them.
NODE_TERMINAL = tr.NODE_TERMINAL
WORKER_ABSENT = tr.WORKER_ABSENT
summarize = tr.summarize  # the workflow's summary (coordd.rules.transitions)
SETTLE_SWEEP_LIMIT = 500  # running workflows settled per maintenance round
PRUNE_BATCH = 100  # ended workflows deleted per transaction by `prune_workflows`


SQL_INSERT_WORKFLOW = (
    "INSERT INTO workflows (workflow_id, name, status, idempotency_key, schedule_id, "
    "created_at, updated_at, spec_sha256) VALUES (?, ?, 'running', ?, ?, ?, ?, ?) "
    "ON CONFLICT (idempotency_key) DO NOTHING RETURNING workflow_id"
)
SQL_WORKFLOW_BY_KEY = (
    "SELECT workflow_id, spec_sha256 FROM workflows WHERE idempotency_key = ?"
)
SQL_INSERT_NODE = (
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at, max_runtime_s, gates_json, "
    "workflow_id, node, result_schema) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SQL_INSERT_EDGE = "INSERT INTO workflow_edges (job_id, dep_job_id, policy) VALUES (?, ?, ?)"
SQL_NODE_IDS = "SELECT node, job_id FROM jobs INDEXED BY jobs_workflow WHERE workflow_id = ?"
SQL_SETTLE_NODES = (
    "SELECT job_id, node, status, required_role, last_error FROM jobs INDEXED BY jobs_workflow "
    "WHERE workflow_id = ? ORDER BY rowid"
)
SQL_NODE_PAYLOAD = "SELECT payload_json FROM jobs WHERE job_id = ?"
SQL_DEP_RESULT = (
    "SELECT j.result_json, a.sha256, a.size, a.path FROM jobs j "
    "LEFT JOIN artifacts a ON a.sha256 = j.artifact_sha256 WHERE j.job_id = ?"
)
SQL_PROMOTE = (
    "UPDATE jobs SET status = 'waiting', payload_json = ?, queued_at = ?, updated_at = ? "
    "WHERE job_id = ? AND status = 'blocked'"
)
SQL_SKIP = (
    "UPDATE jobs SET status = 'skipped', last_error = ?, updated_at = ?, finished_at = ?, "
    "cancel_requested = 0 WHERE job_id = ? AND status IN ('blocked', 'waiting')"
)
SQL_FINISH_WORKFLOW = (
    "UPDATE workflows SET status = ?, summary_json = ?, updated_at = ?, finished_at = ? "
    "WHERE workflow_id = ? AND status = 'running'"
)
SQL_TOUCH_WORKFLOW = "UPDATE workflows SET updated_at = ? WHERE workflow_id = ?"
SQL_RUNNING_WORKFLOWS = (
    "SELECT workflow_id FROM workflows INDEXED BY workflows_status WHERE status = 'running' "
    "ORDER BY created_at LIMIT ?"
)
# Waiting workflow nodes whose wait started before ?1 and whose role no worker with a fresh
# heartbeat (at or after ?2) advertises. Its partial index holds waiting workflow nodes
# only, so plain jobs (however many wait) cost this nothing.
SQL_ABSENT = (
    "SELECT j.job_id, j.workflow_id, j.required_role, max(j.queued_at, j.run_at) "
    "FROM jobs j INDEXED BY jobs_workflow_waiting WHERE j.status = 'waiting' "
    "AND j.workflow_id IS NOT NULL AND j.queued_at <= ?1 AND j.run_at <= ?1 "
    "AND NOT EXISTS (SELECT 1 FROM workers w, json_each(w.roles_json) r "
    "WHERE w.heartbeat_at >= ?2 AND w.offline_at IS NULL AND r.value = j.required_role) "
    "LIMIT ?3"
)


def insert_workflow(conn: sqlite3.Connection, now: float, wf: NewWorkflow
                    ) -> tuple[str, bool, dict[str, str]]:
    """Insert a whole graph: the workflow row, every node (blocked when it has
    dependencies, else waiting) and every edge. Returns (workflow_id, created, node ->
    job_id); a repeated idempotency key with the same graph returns the existing workflow
    (created False).

    Raises:
        errors.InvalidState: the key was used for another graph.
    """
    row = conn.execute(SQL_INSERT_WORKFLOW, (wf.workflow_id, wf.name, wf.idempotency_key,
                                             wf.schedule_id, now, now,
                                             wf.spec_sha256)).fetchone()
    if row is None:
        wid, sha = conn.execute(SQL_WORKFLOW_BY_KEY, (wf.idempotency_key,)).fetchone()
        check_repeat(wf, wid, sha)
        return wid, False, dict(conn.execute(SQL_NODE_IDS, (wid,)).fetchall())
    ids = {n.name: n.job_id for n in wf.nodes}
    for n in wf.nodes:
        t, reason = node_enqueued(wf, n)
        status = t.to_status
        conn.execute(SQL_INSERT_NODE, (
            n.job_id, n.kind, n.required_role, n.priority, dumps(n.payload), status,
            n.max_attempts, now, now, now, now,
            n.max_runtime_s, n.gates_json, wf.workflow_id, n.name, n.result_schema))
        add_request(conn, n.job_id, n.resources)
        if n.limits:
            limit_store.attach(conn, n.job_id, n.limits)
        event(conn, n.job_id, now, None, t.from_status, status, reason)
        for dep, policy in n.needs:
            conn.execute(SQL_INSERT_EDGE, (n.job_id, ids[dep], policy))
    return wf.workflow_id, True, ids


def check_repeat(wf: NewWorkflow, workflow_id: str, stored_sha256: str | None) -> None:
    """A repeated idempotency key (any store): the stored workflow must be this graph.

    Raises:
        errors.InvalidState: the key was used for another graph.
    """
    if stored_sha256 is not None and wf.spec_sha256 is not None \
            and stored_sha256 != wf.spec_sha256:
        raise errors.InvalidState(
            f"idempotency key {wf.idempotency_key!r} was used for another graph "
            f"(workflow {workflow_id}); use a new key for a new graph")


def node_enqueued(wf: NewWorkflow, n: NewNode) -> tuple[tr.Transition, str]:
    """A node's insert (any store): its transition (blocked when it has dependencies,
    else waiting) and its event's reason."""
    return (tr.ENQUEUED_BLOCKED if n.needs else tr.ENQUEUED,
            f"workflow {wf.workflow_id} node {n.name}"
            + (f" (needs {', '.join(d for d, _ in n.needs)})" if n.needs else ""))


def settle(conn: sqlite3.Connection, now: float, workflow_id: str,
           touch: bool = True) -> str | None:
    """Move a workflow forward as far as its nodes' states allow (coordd.rules.transitions.settle
    decides; this applies: skips, promotions with the dependencies' results in the
    payload, the workflow's end and summary); return its status if it ended now (else
    None). `touch` False (the backstop sweep): `updated_at` only moves if something did.

    A promoted node's payload gets the dependencies' results under `inputs` (node name
    -> result), artifacts under `input_artifacts` (by reference: sha256, size, path) and
    the names of failed `run`-policy dependencies under `missing_inputs`.
    """
    # states only: payloads and results are read for the nodes promoted now, not for all
    nodes = [tr.Node(*r) for r in conn.execute(SQL_SETTLE_NODES, (workflow_id,))]
    plan = tr.settle(nodes, conn.execute(SQL_EDGES, (workflow_id,)).fetchall())
    for step in plan.steps:
        if step.t is tr.SKIPPED_DEP:
            skip(conn, now, step.job_id, step.t, step.reason)
        else:
            _promote(conn, now, step)
    if plan.status is None:
        if touch or plan.steps:
            conn.execute(SQL_TOUCH_WORKFLOW, (now, workflow_id))
        return None
    n_done = conn.execute(SQL_FINISH_WORKFLOW, (plan.status, dumps(plan.summary), now, now,
                                                workflow_id)).rowcount
    return plan.status if n_done else None


def _promote(conn: sqlite3.Connection, now: float, step: tr.NodeStep) -> None:
    payload = lenient_json(conn.execute(SQL_NODE_PAYLOAD, (step.job_id,)).fetchone()[0], {})
    inputs = []
    for name, dep_id in step.inputs:
        result_json, a_sha, a_size, a_path = conn.execute(SQL_DEP_RESULT, (dep_id,)).fetchone()
        inputs.append((name, lenient_json(result_json),
                       {"sha256": a_sha, "size": a_size, "path": a_path} if a_sha else None))
    payload = tr.node_payload(payload, inputs, step.missing)
    conn.execute(SQL_PROMOTE, (dumps(payload), now, now, step.job_id))
    event(conn, step.job_id, now, None, step.t.from_status, step.t.to_status, step.reason)


def skip(conn: sqlite3.Connection, now: float, job_id: str, t: tr.Transition,
         reason: str) -> bool:
    """End a blocked or waiting node `skipped` with `reason` (`t`: tr.SKIPPED_DEP or
    tr.SKIPPED_ABSENT); False if it had moved on."""
    if conn.execute(SQL_SKIP, (reason, now, now, job_id)).rowcount == 0:
        return False
    event(conn, job_id, now, None, t.from_status, t.to_status, reason)
    return True


def settle_running(conn: sqlite3.Connection, now: float) -> int:
    """Settle every running workflow (the backstop sweep); return how many ended."""
    ids = [r[0] for r in conn.execute(SQL_RUNNING_WORKFLOWS, (SETTLE_SWEEP_LIMIT,))]
    return sum(settle(conn, now, wid, touch=False) is not None for wid in ids)


def skip_absent(conn: sqlite3.Connection, now: float, wait_s: float, stale_s: float,
                limit: int = 1000) -> list[str]:
    """Skip waiting workflow nodes that waited over `wait_s` while no worker with a fresh
    heartbeat (within `stale_s`) advertised their role; settle their workflows. Returns
    the skipped job ids."""
    rows = conn.execute(SQL_ABSENT, (now - wait_s, now - stale_s, limit)).fetchall()
    skipped, touched = [], set()
    for job_id, workflow_id, role, since in rows:
        reason = tr.absent_reason(role, now - since, wait_s)
        if skip(conn, now, job_id, tr.SKIPPED_ABSENT, reason):
            skipped.append(job_id)
            touched.add(workflow_id)
    for wid in touched:
        settle(conn, now, wid)
    return skipped


SQL_JOB_WORKFLOW = "SELECT workflow_id FROM jobs WHERE job_id = ?"
SQL_SKIPPED_DEPENDENTS = (
    "SELECT e.job_id FROM workflow_edges e INDEXED BY workflow_edges_dep "
    "CROSS JOIN jobs j ON j.job_id = e.job_id WHERE e.dep_job_id = ? "
    "AND +j.status = 'skipped' AND j.last_error LIKE 'dependency_%'"
)
SQL_UNSKIP = (
    "UPDATE jobs SET status = 'blocked', last_error = NULL, finished_at = NULL, "
    "updated_at = ? WHERE job_id = ? AND status = 'skipped'"
)
SQL_HAS_DEPS = "SELECT 1 FROM workflow_edges NOT INDEXED WHERE job_id = ? LIMIT 1"
SQL_REBLOCK = "UPDATE jobs SET status = 'blocked' WHERE job_id = ? AND status = 'waiting'"
SQL_STATUS = "SELECT status FROM jobs WHERE job_id = ?"
SQL_REOPEN_WORKFLOW = (
    "UPDATE workflows SET status = 'running', summary_json = NULL, finished_at = NULL, "
    "updated_at = ? WHERE workflow_id = ?"
)


def settle_job(conn: sqlite3.Connection, now: float, job_id: str) -> None:
    """Settle the workflow of `job_id`, if it is a node of one."""
    row = conn.execute(SQL_JOB_WORKFLOW, (job_id,)).fetchone()
    if row is not None and row[0] is not None:
        settle(conn, now, row[0])


def cancel_job(conn: sqlite3.Connection, now: float, job_id: str) -> StatusResult:
    """An admin cancel (coordd.store.jobs.cancel), then the node's workflow settles: its
    dependents follow their policies in the same transaction."""
    res = cancel(conn, now, job_id)
    settle_job(conn, now, job_id)
    return res


def retry_job(conn: sqlite3.Connection, now: float, job_id: str) -> StatusResult:
    """An admin retry (coordd.store.jobs.retry); a workflow node reopens its workflow (`reopen`)
    and the reply has the node's status after (blocked: it waits for dependencies)."""
    res = retry(conn, now, job_id)
    node = reopen(conn, now, job_id)
    return res if node is None or node == res.status else StatusResult(status=node)


def reopen(conn: sqlite3.Connection, now: float, job_id: str) -> str | None:
    """After `retry` of a workflow node: the workflow runs again, and nodes skipped only
    because of this one (and so on down the graph) are blocked again. The retried node
    itself waits for its dependencies again (and gets their results afresh) if it has
    any. The operator's way back from `worker_absent`: add a worker with the capability,
    then retry the skipped node. Returns the node's status afterwards (None: no workflow).
    """
    row = conn.execute(SQL_JOB_WORKFLOW, (job_id,)).fetchone()
    if row is None or row[0] is None:
        return None
    if conn.execute(SQL_HAS_DEPS, (job_id,)).fetchone() is not None \
            and conn.execute(SQL_REBLOCK, (job_id,)).rowcount:
        t = tr.REBLOCKED
        event(conn, job_id, now, None, t.from_status, t.to_status,
              "retried: waits for its dependencies")
    todo = [job_id]
    while todo:
        for (dep,) in conn.execute(SQL_SKIPPED_DEPENDENTS, (todo.pop(),)).fetchall():
            if conn.execute(SQL_UNSKIP, (now, dep)).rowcount:
                t = tr.UNSKIPPED
                event(conn, dep, now, None, t.from_status, t.to_status,
                      f"dependency {job_id} retried")
                todo.append(dep)
    conn.execute(SQL_REOPEN_WORKFLOW, (now, row[0]))
    settle(conn, now, row[0])
    return conn.execute(SQL_STATUS, (job_id,)).fetchone()[0]


SQL_OPEN_NODES = (
    "SELECT job_id FROM jobs INDEXED BY jobs_workflow WHERE workflow_id = ? "
    "AND status IN ('blocked', 'waiting', 'running') ORDER BY rowid"
)
SQL_PRUNE_WORKFLOWS = (
    "DELETE FROM workflows WHERE workflow_id IN (SELECT w.workflow_id FROM workflows w "
    "INDEXED BY workflows_status WHERE w.status IN ('succeeded', 'partial', 'failed', "
    "'cancelled') AND w.finished_at < ? AND NOT EXISTS "
    "(SELECT 1 FROM jobs j INDEXED BY jobs_workflow WHERE j.workflow_id = w.workflow_id) "
    "LIMIT ?)"
)


def cancel_workflow(conn: sqlite3.Connection, now: float, workflow_id: str) -> int:
    """Cancel every node not yet ended (coordd.store.jobs.cancel: blocked and waiting ones at
    once, running ones by request, ended by their holder); return how many.

    Raises:
        errors.NotFound: no such workflow.
    """
    if workflow_row(conn, workflow_id) is None:
        raise errors.NotFound(f"workflow {workflow_id} not found")
    ids = [r[0] for r in conn.execute(SQL_OPEN_NODES, (workflow_id,)).fetchall()]
    for job_id in ids:
        cancel(conn, now, job_id)
    settle(conn, now, workflow_id)
    return len(ids)


def prune_workflows(conn: sqlite3.Connection, cutoff: float, limit: int = PRUNE_BATCH) -> int:
    """Delete ended workflows finished before `cutoff` whose jobs `prune` has removed."""
    return conn.execute(SQL_PRUNE_WORKFLOWS, (cutoff, limit)).rowcount
