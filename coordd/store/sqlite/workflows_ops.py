"""SQLiteStore's workflows (coordd.store.api_workflows): thin adapters over the functions
the SQLite Coordinator calls (coordd.store.workflows through the writer, the views of
coordd.rules.workflow_views on the read pool)."""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.rules.workflow_views import workflow_view, workflow_views
from coordd.wire.workflows import WorkflowList, WorkflowSubmitResult, WorkflowView
from coordd.store import workflow_reads as wreads
from coordd.store import workflows as wstore


class SQLiteWorkflows:
    """The workflow methods of coordd.store.sqlite.store.SQLiteStore (a mixin: it uses
    the store's `_write` and `readers`)."""

    _write: Any
    readers: Any

    async def workflow_submit(self, wf: wstore.NewWorkflow, *,
                              now: float | None = None) -> WorkflowSubmitResult:
        """Insert the whole graph in one writer request (wstore.insert_workflow)."""
        wid, created, ids = await self._write(
            lambda conn, t: wstore.insert_workflow(conn, t, wf), now)
        return WorkflowSubmitResult(workflow_id=wid, created=created, jobs=ids)

    async def workflow_get(self, workflow_id: str) -> WorkflowView:
        return await self.readers.run(_get, workflow_id)

    async def workflow_list(self, status: str | None, limit: int) -> WorkflowList:
        return WorkflowList(workflows=await self.readers.run(_list, status, limit))

    async def workflow_cancel(self, workflow_id: str, *,
                              now: float | None = None) -> WorkflowView:
        await self._write(lambda conn, t: wstore.cancel_workflow(conn, t, workflow_id), now)
        return await self.workflow_get(workflow_id)

    async def job_node(self, job_id: str) -> tuple[str | None, str | None, str | None,
                                                   list[tuple[str, str, str]]]:
        return await self.readers.run(wreads.node_info, job_id)

    async def workflow_settle_running(self, *, now: float | None = None) -> int:
        return await self._write(wstore.settle_running, now)

    async def workflow_skip_absent(self, wait_s: float, stale_s: float, *,
                                   now: float | None = None) -> list[str]:
        """Skip, `worker_absent`, the waiting nodes no live worker can run
        (wstore.skip_absent); return their job ids."""
        return await self._write(
            lambda conn, t: wstore.skip_absent(conn, t, wait_s, stale_s), now)


def _get(conn: Any, workflow_id: str) -> WorkflowView:
    """One workflow with every node (reader connection). Raises: errors.NotFound."""
    row = wreads.workflow_row(conn, workflow_id)
    if row is None:
        raise errors.NotFound(f"workflow {workflow_id} not found")
    return workflow_view(row, *wreads.node_rows(conn, workflow_id))


def _list(conn: Any, status: str | None, limit: int) -> list[WorkflowView]:
    """Workflows by `status` (None: all), at most `limit`, with node counts (reader)."""
    rows = wreads.workflow_rows(conn, status, limit)
    return workflow_views(rows, wreads.workflow_counts(conn, [r[0] for r in rows]))
