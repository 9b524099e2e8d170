"""Workflow statements run on coordd's one loop: each must be an index search whatever the
planner's statistics say (a stale sqlite_stat1 once turned the edge read into a scan of
every edge, ~1.5 s per submit/complete on a 1M-edge DB), and a graph's size is capped."""

from __future__ import annotations

import re
import sqlite3

import msgspec
import pytest

from coordd import errors, store
from coordd.wire.workflows import ListWorkflows, WorkflowSubmit
from coordd.store import schedules, upkeep, workflow_reads
from coordd.store import workflows as wstore
from coordd.service.workflows import EDGES_MAX, NODES_MAX

JOB_PK = "sqlite_autoindex_jobs_1"
WF_PK = "sqlite_autoindex_workflows_1"

# statement -> the indexes its plan must search (every table access a SEARCH)
HOT: dict[str, list[str]] = {
    "SQL_WORKFLOW_BY_KEY": ["sqlite_autoindex_workflows_2"],
    "SQL_NODE_IDS": ["jobs_workflow"],
    "SQL_NODES": ["jobs_workflow", "sqlite_autoindex_artifacts_1"],
    "SQL_SETTLE_NODES": ["jobs_workflow"],
    "SQL_NODE_PAYLOAD": [JOB_PK],
    "SQL_DEP_RESULT": [JOB_PK, "sqlite_autoindex_artifacts_1"],
    "SQL_EDGES": ["jobs_workflow", "SEARCH e USING PRIMARY KEY"],
    "SQL_PROMOTE": [JOB_PK],
    "SQL_SKIP": [JOB_PK],
    "SQL_FINISH_WORKFLOW": [WF_PK],
    "SQL_TOUCH_WORKFLOW": [WF_PK],
    "SQL_RUNNING_WORKFLOWS": ["workflows_status"],
    "SQL_ABSENT": ["jobs_workflow_waiting"],
    "SQL_JOB_WORKFLOW": [JOB_PK],
    "SQL_SKIPPED_DEPENDENTS": ["workflow_edges_dep", JOB_PK],
    "SQL_UNSKIP": [JOB_PK],
    "SQL_HAS_DEPS": ["USING PRIMARY KEY"],
    "SQL_REBLOCK": [JOB_PK],
    "SQL_STATUS": [JOB_PK],
    "SQL_REOPEN_WORKFLOW": [WF_PK],
    "SQL_OPEN_NODES": ["jobs_workflow"],
    "SQL_PRUNE_WORKFLOWS": ["workflows_status", "jobs_workflow"],
    "SQL_DUE_SCHEDULES": ["schedules_due"],
    "SQL_ADVANCE_SCHEDULE": ["sqlite_autoindex_schedules_1"],
    "SQL_GET_WORKFLOW": [WF_PK],
    "SQL_JOB_NODE": [JOB_PK],
    "SQL_JOB_DEPS": ["SEARCH e USING PRIMARY KEY", JOB_PK],
}
# scans allowed: SQL_ABSENT's subquery reads the (small) workers table and its roles
ALLOWED_SCANS = {"SCAN w", "SCAN r VIRTUAL TABLE INDEX 1:"}

# Statistics that lie: every index looks useless, the edge table tiny, one workflow huge.
SKEWED = [
    ("jobs", "jobs_workflow", "1000000 1000000 1"),
    ("jobs", "jobs_status", "1000000 1 1"),
    ("jobs", "jobs_finished", "1000000 1 1 1"),
    ("workflow_edges", "workflow_edges_dep", "1000000 1000000"),
    ("workflow_edges", "workflow_edges", "10 10 1"),
    ("workflows", "workflows_status", "1000000 1000000 1"),
]
TINY = [("jobs", "jobs_workflow", "1 1 1"), ("workflow_edges", "workflow_edges_dep", "1 1"),
        ("workflow_edges", "workflow_edges", "1 1 1"), ("workflows", "workflows_status", "1 1 1")]


def _plan(conn: sqlite3.Connection, sql: str) -> list[str]:
    n = max([int(x) for x in re.findall(r"\?(\d)", sql)] or [sql.count("?")])
    return [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, (1,) * n)]


@pytest.mark.parametrize("stats", [None, [], SKEWED, TINY], ids=["none", "empty", "skewed",
                                                                  "tiny"])
def test_hot_workflow_statements_search_their_index_whatever_the_stats(stats):
    conn = sqlite3.connect(":memory:", isolation_level=None)
    store.migrate(conn)
    if stats is not None:
        conn.execute("ANALYZE")
        conn.execute("DELETE FROM sqlite_stat1")
        conn.executemany("INSERT INTO sqlite_stat1 VALUES (?, ?, ?)", stats)
        conn.execute("ANALYZE sqlite_master")  # reload the statistics
    modules = (wstore, workflow_reads, schedules)  # SQLite's workflow statements
    sqls = {name: next(getattr(m, name) for m in modules if hasattr(m, name)) for name in HOT}
    sqls["SQL_PRUNE_PICK"] = upkeep.SQL_PRUNE_PICK
    expected = {**HOT, "SQL_PRUNE_PICK": ["jobs_finished", WF_PK]}
    bad = {}
    for name, sql in sqls.items():
        plan = _plan(conn, sql)
        scans = [p for p in plan if p.startswith("SCAN") and p not in ALLOWED_SCANS]
        missing = [ix for ix in expected[name]
                   if not any(p.startswith("SEARCH") and ix in p for p in plan)]
        if scans or missing:
            bad[name] = plan
    conn.close()
    assert bad == {}


def _dense(n: int, extra_edges: int = 0) -> WorkflowSubmit:
    """n nodes in a chain; the last `extra` nodes also need earlier ones, up to the count."""
    nodes: list[dict] = [{"name": f"n{i}", "kind": "k", "required_role": "cpu",
                          "needs": [f"n{i - 1}"] if i else []} for i in range(n)]
    left = extra_edges
    for i in range(n - 1, 1, -1):
        if left <= 0:
            break
        more = [f"n{j}" for j in range(max(0, i - 1 - left), i - 1)]
        nodes[i]["needs"] += more
        left -= len(more)
    return msgspec.convert({"name": "dense", "nodes": nodes}, WorkflowSubmit)


async def test_edge_cap_refuses_a_dense_graph_before_queuing(bundle):
    spec = _dense(NODES_MAX, EDGES_MAX - (NODES_MAX - 1) + 1)
    assert sum(len(n.needs) for n in spec.nodes) == EDGES_MAX + 1
    with pytest.raises(errors.BadRequest, match=f"at most {EDGES_MAX} dependencies"):
        await bundle.coord.workflow_submit(spec)
    assert (await bundle.coord.workflow_list(ListWorkflows())).workflows == []
    assert sum((await bundle.coord.status()).jobs.values()) == 0
    full = _dense(NODES_MAX, EDGES_MAX - (NODES_MAX - 1))
    assert sum(len(n.needs) for n in full.nodes) == EDGES_MAX
    sub = await bundle.coord.workflow_submit(full)  # the largest graph allowed is accepted
    assert sub.created and len(sub.jobs) == NODES_MAX


async def test_a_1000_node_chain_listed_backwards_is_accepted(bundle):
    """Dependencies first or last in the file: no recursion limit in the ordering."""
    spec = msgspec.convert({"name": "chain", "nodes": [
        {"name": f"n{i}", "kind": "k", "required_role": "cpu",
         "needs": [f"n{i - 1}"] if i else []} for i in range(NODES_MAX - 1, -1, -1)]},
        WorkflowSubmit)
    sub = await bundle.coord.workflow_submit(spec)
    assert sub.created and len(sub.jobs) == NODES_MAX
    cyc = msgspec.convert({"name": "ring", "nodes": [
        {"name": f"n{i}", "kind": "k", "required_role": "cpu",
         "needs": [f"n{(i + 1) % NODES_MAX}"]} for i in range(NODES_MAX)]}, WorkflowSubmit)
    with pytest.raises(errors.BadRequest, match="dependency cycle: n0 -> n1 -> n2 -> "):
        await bundle.coord.workflow_submit(cyc)
