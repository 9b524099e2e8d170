"""The store interface's workflows (coordd.store.api's `Store`, this area apart).

A workflow is a graph of jobs (its nodes) queued whole; a node with dependencies waits
`blocked` and is queued (`waiting`) when they have ended as its edges allow; every job
ending of a node (complete, fail, release, cancel, the reaper, a dead letter) settles its
workflow (coordd.rules.transitions.settle), in the same transaction on PostgreSQL. The graph is
validated above the store (coordd.service.workflows.Workflows.plan, into a NewWorkflow); the
store stores it.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from coordd.wire.workflows import WorkflowList, WorkflowSubmitResult, WorkflowView


class NewNode(msgspec.Struct, kw_only=True):
    """A validated node ready to insert (payload already a dict, JSON encoded later)."""

    job_id: str
    name: str
    kind: str
    required_role: str
    priority: int
    payload: dict[str, Any]
    max_attempts: int
    max_runtime_s: float | None = None
    gates_json: str | None = None
    result_schema: str | None = None
    needs: list[tuple[str, str]] = []  # (dependency node name, policy)
    resources: Any = None  # a coordd.rules.resources.Request (stored in coordd.store.resources)
    limits: list[tuple[str, int]] = []  # fleet-wide limits it consumes (name, units)


class NewWorkflow(msgspec.Struct, kw_only=True):
    """A validated graph: nodes in topological order, ids chosen."""

    workflow_id: str
    name: str
    nodes: list[NewNode]
    idempotency_key: str | None = None
    schedule_id: str | None = None
    spec_sha256: str | None = None  # of the graph as submitted (coordd.service.workflows.spec_hash)


class WorkflowStore(Protocol):
    """Workflows over one database (SQLite: coordd.store.sqlite.workflows_ops; PostgreSQL:
    coordd.store.postgres.workflows). `now` as in coordd.store.api.

    Raises (both stores, the same situations):
        errors.NotFound: no such workflow.
        errors.InvalidState: a repeated idempotency key with another graph.
        errors.BadRequest: what the store cannot store (a value out of its range), as for
            enqueue; gates, resources, limits and result schemas are stored on both.
    """

    async def workflow_submit(self, wf: NewWorkflow, *,
                              now: float | None = None) -> WorkflowSubmitResult: ...
    async def workflow_get(self, workflow_id: str) -> WorkflowView: ...
    async def workflow_list(self, status: str | None, limit: int) -> WorkflowList: ...
    async def workflow_cancel(self, workflow_id: str, *,
                              now: float | None = None) -> WorkflowView: ...

    async def job_node(self, job_id: str) -> tuple[str | None, str | None, str | None,
                                                   list[tuple[str, str, str]]]:
        """(workflow_id, node name, result schema, [(dependency node, its status, edge
        policy)] in the dependencies' order) of a job; Nones and [] for a plain job."""
        ...

    async def workflow_settle_running(self, *, now: float | None = None) -> int:
        """Settle every running workflow (the maintenance backstop); return how many
        ended. SQLite needs it after an expired lease's last attempt; PostgreSQL settles
        those in the reaper's transaction, so it finds nothing left to do."""
        ...

    async def workflow_skip_absent(self, wait_s: float, stale_s: float, *,
                                   now: float | None = None) -> list[str]:
        """Skip (`skipped`, reason `worker_absent`) every waiting node whose
        `required_role` no worker with a heartbeat fresher than `stale_s` has offered for
        `wait_s` seconds and settle their workflows, in one transaction; return the
        skipped job ids. The caller keeps its own guard (coordd.
        workflows.Workflows.tick: nothing is skipped before coordd has itself run for
        `wait_s`)."""
        ...


__all__ = ["NewNode", "NewWorkflow", "WorkflowStore"]
