"""Issue 14 bug 1, the other half: every view survives any time already stored. The
values are written straight into the database (as a row from before the boundary checks,
or a hand edit, would be), then each read and each coordctl renderer runs on them."""

from __future__ import annotations

import io
import math
import sqlite3

import pytest
from rich.console import Console

from coordctl import render, top, workflow as wf_render
from coordd.wire.protocol import (
    AgentQuery, AgentStatusUpdate, Empty, JobId, ListJobs, ReadMessages, SendMessage,
)
from coordd.wire.workflows import ListWorkflows, WorkflowId
from coordd.rules.times import fmt_time
from tests.unit.test_workflow_input import ONE
from tests.unit.test_workflows import _convert

INF = float("inf")
# what a REAL column can hold that no calendar can show (NaN is stored as NULL by SQLite)
ODD = [1e300, -1e300, INF, -INF, 1e15, -62135596801.0, 253402300800.0]


@pytest.mark.parametrize("ts", [*ODD, float("nan"), "soon", None])
def test_fmt_time_and_fmt_age_never_raise(ts):
    shown = fmt_time(ts)
    assert shown == "-" if ts is None else "not a valid time" in shown
    render.fmt_age(ts)


def _poke(db_path: str, value: float) -> None:
    """Write `value` into every time column of every row, as a hand edit would."""
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("UPDATE jobs SET run_at = ?1, queued_at = ?1, created_at = ?1, "
                     "updated_at = ?1, finished_at = ?1, max_runtime_s = ?1", (value,))
        conn.execute("UPDATE leases SET granted_at = ?1, expires_at = ?1, lease_s = ?1",
                     (value,))
        conn.execute("UPDATE job_events SET at = ?", (value,))
        conn.execute("UPDATE workers SET heartbeat_at = ?1, first_seen_at = ?1, "
                     "heartbeat_json = json_set(heartbeat_json, '$.user_idle_s', ?1, "
                     "'$.memory_used_pct', ?1, '$.temperature_c', ?1)", (value,))
        conn.execute("UPDATE messages SET created_at = ?1, expires_at = ?1", (value,))
        conn.execute("UPDATE agents SET heartbeat_at = ?1, first_seen_at = ?1", (value,))
        conn.execute("UPDATE workflows SET created_at = ?1, updated_at = ?1, "
                     "finished_at = ?1", (value,))
        conn.execute("UPDATE schedules SET next_at = ?1, last_slot = ?1", (value,))
    conn.close()


async def _fill(bundle) -> list[str]:
    """A waiting, a running (leased), a failed and a workflow job; a worker, a message,
    an agent, a schedule."""
    c = bundle.coord
    await bundle.worker("w1")
    running = await bundle.enqueue(priority=0)
    await bundle.claim("w1")
    waiting = await bundle.enqueue(priority=1, role="cpu")
    gpu = await bundle.enqueue(priority=2, role="gpu")
    await c.workflow_submit(_convert(ONE))
    await c.schedule_add(_convert_schedule())
    await c.send_message(SendMessage(sender="a", recipient="b", content="hi", ttl_s=60.0))
    await c.update_agent_status(AgentStatusUpdate(name="b", status="idle"))
    return [running, waiting, gpu]


def _convert_schedule():
    import msgspec
    from coordd.wire.workflows import ScheduleAdd
    return msgspec.convert({"name": "s", "cron": "0 * * * *", "workflow": ONE}, ScheduleAdd)


def _print(renderable_or_fn, *args) -> str:
    out = io.StringIO()
    con = Console(file=out, width=120)
    if callable(renderable_or_fn):
        renderable_or_fn(con, *args)
    else:
        con.print(renderable_or_fn)
    return out.getvalue()


class _Client:
    """coordctl's calls, served by the Coordinator in-process (for top.frame)."""

    def __init__(self, coord, results):
        self._coord, self._results = coord, results

    def status(self):
        return self._results["status"]

    def workers(self):
        return self._results["workers"]

    def list_jobs(self, status, limit, newest_first=False):
        return self._results[f"list_{status}"]


def _poke_text(db_path: str) -> None:
    """Text where a job's, lease's, event's and worker's times (and readings) belong."""
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("UPDATE jobs SET run_at = 'soon', queued_at = 'soon', created_at = x'01', "
                     "updated_at = 'soon', finished_at = 'soon', max_runtime_s = 'long'")
        conn.execute("UPDATE leases SET granted_at = 'a', expires_at = 'b', lease_s = 'c'")
        conn.execute("UPDATE job_events SET at = 'then'")
        conn.execute("UPDATE workers SET heartbeat_at = 'now', heartbeat_json = json_set("
                     "heartbeat_json, '$.user_idle_s', 'long', '$.temperature_c', 'warm', "
                     "'$.memory_used_pct', 'lots')")
    conn.close()


@pytest.mark.parametrize("value", [*ODD, "text"])
async def test_every_view_survives_any_stored_time(bundle, value):
    ids = await _fill(bundle)
    if value == "text":
        _poke_text(bundle.db_path)
    else:
        _poke(bundle.db_path, value)
    c = bundle.coord
    st = await c.status()
    waiting = (await c.list_jobs(ListJobs(status="waiting"))).jobs
    page = await c.list_jobs(ListJobs())
    running = await c.list_jobs(ListJobs(status="running"))
    failed = await c.list_jobs(ListJobs(status="failed", newest_first=True))
    jobs = [await c.get_job(JobId(job_id=i)) for i in ids]
    workers = await c.workers()
    flows = await c.workflow_list(ListWorkflows())
    flow = await c.workflow_get(WorkflowId(workflow_id=flows.workflows[0].workflow_id))
    await c.schedule_list()
    agents = await c.get_agent_status(AgentQuery())
    await c.read_messages(ReadMessages(reader="b"))
    await c.metrics(Empty())
    assert {j.job_id for j in page.jobs} >= set(ids)
    assert all(j.waiting_reason for j in waiting)  # each says why, whatever its run_at
    # every coordctl renderer, on what coordd answered
    shown = [{"job_id": w.job_id, "kind": w.kind, "required_role": w.required_role,
              "priority": w.priority, "age_s": w.waited_s, "waiting_reason": w.reason}
             for w in st.waiting] + [  # as `coordctl status` shows them (its fallback too)
        {"job_id": j.job_id, "kind": j.kind, "required_role": j.required_role,
         "priority": j.priority, "age_s": j.age_s, "waiting_reason": j.waiting_reason}
        for j in waiting]
    text = _print(render.status, st, shown, list(st.warnings))
    text += _print(render.job_list, page, False)
    for j in jobs:
        text += _print(render.job, j)
    text += _print(render.workers, workers)
    text += _print(top.frame(_Client(c, {"status": st, "workers": workers,
                                          "list_running": running, "list_failed": failed}),
                             1.0)[0])
    text += _print(wf_render.tree(flow)) + _print(wf_render.list_table(flows.workflows))
    text += _print(wf_render.summary_text(flow))
    from coordctl.msg import _agents
    text += _print(_agents, agents)
    assert ids[0] in text
    if value == "text" or not math.isfinite(value) or abs(value) > 1e12:
        assert "not a valid time" in text


@pytest.mark.parametrize("value", [-INF, -1e300])
async def test_a_schedule_slot_no_calendar_has_does_not_stall_the_maintenance_round(
        bundle, value):
    await bundle.coord.schedule_add(_convert_schedule())
    _poke(bundle.db_path, value)
    assert (await bundle.coord.flows.tick())[2] == 1  # started once, at coordd's now
    nxt = (await bundle.coord.schedule_list()).schedules[0].next_at
    assert bundle.clock.wall() < nxt <= bundle.clock.wall() + 3600
