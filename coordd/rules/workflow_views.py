"""A workflow's views from its stored rows (pure, the same on every store: SQLite's rows
from coordd.store.workflows, PostgreSQL's from coordd.store.postgres.workflows)."""

from __future__ import annotations

from coordd.jsontext import lenient_json
from coordd.wire.workflows import NeedView, NodeArtifact, NodeView, WorkflowView


def workflow_view(row: tuple, node_rows: list[tuple], edge_rows: list[tuple]) -> WorkflowView:
    """A workflow with every node from its stored rows (any store): `row` as
    coordd.store.workflow_reads.SQL_GET_WORKFLOW, nodes as SQL_NODES, edges as SQL_EDGES."""
    names = {r[0]: r[1] for r in node_rows}
    needs: dict[str, list[NeedView]] = {}
    for job_id, dep_id, policy in edge_rows:
        needs.setdefault(job_id, []).append(NeedView(node=names[dep_id], policy=policy))
    nodes, counts = [], {}
    for (job_id, node, status, kind, role, attempts, max_attempts, result_json, last_error,
         a_sha, a_size, a_path) in node_rows:
        counts[status] = counts.get(status, 0) + 1
        nodes.append(NodeView(
            name=node, job_id=job_id, kind=kind, required_role=role, status=status,
            attempts=attempts, max_attempts=max_attempts, needs=needs.get(job_id, []),
            reason=last_error, result=lenient_json(result_json),
            artifact=NodeArtifact(sha256=a_sha, size=a_size, path=a_path) if a_sha else None))
    view = _view(row, counts)
    view.nodes = nodes
    return view


def workflow_views(rows: list[tuple], counts: dict[str, dict[str, int]]) -> list[WorkflowView]:
    """Workflows (rows as coordd.store.workflow_reads.SQL_LIST_WORKFLOWS) with node counts by
    status (workflow id -> status -> n), any store."""
    return [_view(r, counts.get(r[0])) for r in rows]


def _view(row: tuple, counts: dict[str, int] | None = None) -> WorkflowView:
    (wid, name, status, key, sid, created_at, updated_at, finished_at, summary_json) = row
    return WorkflowView(workflow_id=wid, name=name, status=status, created_at=created_at,
                        updated_at=updated_at, finished_at=finished_at,
                        summary=lenient_json(summary_json), idempotency_key=key,
                        schedule_id=sid, counts=counts or {})
