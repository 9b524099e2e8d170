"""Issue 14 bug 1 end to end: a job whose times no calendar can show (written into the
database straight, as a row from before the boundary checks would be) does not break
coordctl's views, nor coordd-mcp's tools: each answers, exit 0, and says what it found."""

from __future__ import annotations

import json

import pytest

from coordd.client import SyncClient
from tests.integration.test_coordctl import COOL, ctl, ok
from tests.unit.test_views_stored_values import _poke


def _fill(sock: str) -> list[str]:
    with SyncClient(sock) as c:
        c.heartbeat("w1", ["cpu"], COOL)
        running = c.enqueue(kind="k", required_role="cpu", priority=0).job_id
        assert c.claim("w1").job is not None
        waiting = c.enqueue(kind="k", required_role="gpu", priority=1).job_id
    return [running, waiting]


@pytest.mark.parametrize("value", [1e15, float("-inf")])
def test_coordctl_views_survive_any_stored_time(daemon, value):
    ids = _fill(daemon.socket)
    _poke(daemon.db, value)
    sock = daemon.socket
    assert "waiting 1" in ok(ctl(sock, "status"))
    assert all(i in ok(ctl(sock, "list")) for i in ids)
    assert ids[1] in ok(ctl(sock, "list", "--status", "waiting"))
    shown = ok(ctl(sock, "show", ids[0]))
    assert "not a valid time" in shown and "w1" in shown
    assert "w1" in ok(ctl(sock, "workers"))
    assert "w1" in ok(ctl(sock, "top", "--once"))  # (at -inf the reaper may have run)
    assert json.loads(ok(ctl(sock, "--json", "show", ids[1])))["job_id"] == ids[1]


async def test_mcp_tools_survive_any_stored_time(daemon):
    from tests.integration.test_mcp import mcp_session
    from tests.integration.test_mcp import ok as tool_ok
    import asyncio
    ids = await asyncio.to_thread(_fill, daemon.socket)
    _poke(daemon.db, float("inf"))
    async with mcp_session(daemon.socket) as s:
        job = await tool_ok(s, "get_job", job_id=ids[0])
        assert job["job_id"] == ids[0] and job["run_at"] is None  # JSON has no Infinity
        listed = await tool_ok(s, "list_jobs")
        assert {j["job_id"] for j in listed["jobs"]} == set(ids)
        assert (await tool_ok(s, "coordinator_status"))["jobs"]["waiting"] == 1
        done = await tool_ok(s, "wait_for_job", job_id=ids[1], timeout_s=0)
        assert done["terminal"] is False
        # and the tool schema refuses such a time before coordd sees it, naming the field
        from tests.integration.test_mcp import tool_error
        text = await tool_error(s, "enqueue_job", kind="k", required_role="cpu", priority=1,
                                run_at=1e15)
        assert text.startswith("bad_request: enqueue_job: run_at: 1000000000000000.0 is "
                               "greater than the maximum of 4102444800"), text
