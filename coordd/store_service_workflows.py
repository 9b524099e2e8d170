"""The workflow RPC methods over the store interface (coordd.store.api_workflows): what
coordd serves of workflows on a PostgreSQL store.

Same params, checks, replies and log lines as the SQLite Coordinator's (coordd.workflows:
`Workflows.plan` validates the graph, `check_list` the list's params). Schedules and the
maintenance round's `worker_absent` skips are not served here yet (`unknown_method`).
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd import workflows as flows
from coordd.protocol_workflows import (
    ListWorkflows, WorkflowId, WorkflowList, WorkflowSubmit, WorkflowSubmitResult,
    WorkflowView,
)

WORKFLOW_METHODS = frozenset({"workflow_submit", "workflow_get", "workflow_list",
                              "workflow_cancel"})
"""The workflow methods served over the store interface (in StoreCoordinator's SERVED)."""
WORKFLOW_ID_CHARS = 16  # coordd.ids: 16 hex characters


class WorkflowService:
    """StoreCoordinator's workflow methods (a mixin: the coordinator's `store`, and what
    `Workflows.plan` reads: config, check_gates, new_job_id, limit_book, resources_seen)."""

    store: Any

    async def workflow_submit(self, p: WorkflowSubmit) -> WorkflowSubmitResult:
        """Validate and queue a whole graph in one transaction. Raises: BadRequest,
        PayloadTooLarge (as on SQLite; also what this store does not store yet),
        InvalidState (a repeated key with another graph)."""
        wf = flows.Workflows(self).plan(p)  # type: ignore[arg-type]  # the checks it reads
        return flows.submitted(wf, await self.store.workflow_submit(wf))

    async def workflow_get(self, p: WorkflowId) -> WorkflowView:
        """One workflow with every node. A `prefix` lookup takes the whole id only.
        Raises: NotFound."""
        try:
            return await self.store.workflow_get(p.workflow_id)
        except errors.NotFound as exc:
            raise _whole_id(p, exc) from exc

    async def workflow_list(self, p: ListWorkflows) -> WorkflowList:
        """Workflows, newest first, with node counts by status. Raises: BadRequest."""
        flows.check_list(p)
        return await self.store.workflow_list(p.status, p.limit)

    async def workflow_cancel(self, p: WorkflowId) -> WorkflowView:
        """Cancel every node that has not ended (running ones stop at their holder's next
        renew or heartbeat); return the workflow. Raises: NotFound."""
        try:
            return await self.store.workflow_cancel(p.workflow_id)
        except errors.NotFound as exc:
            raise _whole_id(p, exc) from exc


def _whole_id(p: WorkflowId, exc: errors.NotFound) -> errors.NotFound:
    """NotFound, saying so where a shorter prefix was given (looked up as a whole id)."""
    if p.prefix and len(p.workflow_id) < WORKFLOW_ID_CHARS:
        return errors.NotFound(f"{exc.message} (the PostgreSQL store looks workflows up by "
                               f"their whole {WORKFLOW_ID_CHARS}-character id, not a "
                               "prefix, yet)")
    return exc
