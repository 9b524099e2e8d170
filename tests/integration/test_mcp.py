"""coordd-mcp through the MCP SDK's own stdio client: the client launches `coordd-mcp` as a
subprocess, lists the tools, enqueues a job that a real coord-worker runs, and reads the
result; bad arguments and refused admin calls come back as tool errors carrying coordd's
error code, and change nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.integration.workerbench import COOL, DAEMON_FAST, worker_toml

TOOL_NAMES = {"enqueue_job", "get_job", "list_jobs", "cancel_job", "wait_for_job",
              "coordinator_status", "send_message", "read_messages", "broadcast",
              "get_agent_status", "update_agent_status", "ack_messages", "retry_job",
              "list_workers", "submit_workflow", "get_workflow"}


def _coordd_mcp() -> str:
    beside = Path(sys.executable).parent / "coordd-mcp"  # the console script of this venv
    found = str(beside) if beside.exists() else shutil.which("coordd-mcp")
    assert found, "coordd-mcp is not installed (pip install -e '.[test]')"
    return found


@asynccontextmanager
async def mcp_session(sock: str, agent: str = "tester"):
    """An initialized ClientSession to a `coordd-mcp` subprocess."""
    params = StdioServerParameters(command=_coordd_mcp(),
                                   args=["--socket", sock, "--agent", agent],
                                   env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def ok(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    res = await session.call_tool(tool, arguments)
    assert not res.isError, res.content[0].text
    assert json.loads(res.content[0].text) == res.structuredContent
    return res.structuredContent


async def tool_error(session: ClientSession, tool: str, **arguments: Any) -> str:
    res = await session.call_tool(tool, arguments)
    assert res.isError, res
    return res.content[0].text


def _counts(db: str) -> tuple[int, int, int]:
    conn = sqlite3.connect(db)
    try:
        return tuple(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                     for t in ("jobs", "messages", "agents"))
    finally:
        conn.close()


@pytest.fixture
def keywords_worker(tmp_path):
    """Start a real coord-worker running the `keywords` model; stopped at teardown."""
    procs: list[subprocess.Popen] = []

    def start(sock: str) -> subprocess.Popen:
        kinds = {"keywords": {"argv": ["{python}", "-m", "worker.models.keywords",
                                       "--payload", "{payload}", "--result", "{result}"]}}
        cfg = tmp_path / "worker.toml"
        cfg.write_text(worker_toml(tmp_path / "work", kinds))
        override = tmp_path / "readings.json"
        override.write_text(json.dumps(COOL))
        log = open(tmp_path / "worker.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "--worker-id", "mcp-w1", "--roles", "cpu",
             "--socket", sock, "--config", str(cfg), "--readings-override", str(override)],
            stdout=log, stderr=log)
        log.close()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


async def test_mcp_client_enqueues_a_job_a_real_worker_runs_and_reads_the_result(
        daemon_factory, keywords_worker):
    d = daemon_factory(DAEMON_FAST)
    d.start()
    async with mcp_session(d.socket) as s:
        listed = (await s.list_tools()).tools
        assert {t.name for t in listed} == TOOL_NAMES
        for t in listed:
            assert t.description and "\n" not in t.description
            assert t.inputSchema["type"] == "object"
            assert t.inputSchema["additionalProperties"] is False
        enq = next(t for t in listed if t.name == "enqueue_job").inputSchema
        assert enq["required"] == ["kind", "required_role", "priority"]
        assert enq["properties"]["priority"] == {**enq["properties"]["priority"],
                                                 "minimum": 0, "maximum": 3}

        job = await ok(s, "enqueue_job", kind="keywords", required_role="cpu", priority=0,
                       payload={"module": "json", "top": 5})
        assert job["created"] is True
        pending = await ok(s, "wait_for_job", job_id=job["job_id"], timeout_s=0)
        assert pending["terminal"] is False and pending["job"]["status"] == "waiting"
        worker = keywords_worker(d.socket)
        done = await ok(s, "wait_for_job", job_id=job["job_id"], timeout_s=20)
        assert done["terminal"] is True, done
        assert done["job"]["status"] == "succeeded", done["job"]["last_error"]
        result = (await ok(s, "get_job", job_id=job["job_id"]))["result"]
        assert result["module"] == "json" and len(result["top"]) == 5
        listed_jobs = await ok(s, "list_jobs", status="succeeded")
        assert [j["job_id"] for j in listed_jobs["jobs"]] == [job["job_id"]]
        status = await ok(s, "coordinator_status")
        assert status["jobs"]["succeeded"] == 1 and status["workers"] == 1

        # this agent's status and messages, through the same server
        me = await ok(s, "update_agent_status", status="busy", metadata={"job": job["job_id"]})
        assert (me["name"], me["status"], me["live"]) == ("tester", "busy", True)
        sent = await ok(s, "send_message", recipient="tester", content={"job": job["job_id"]},
                        message_type="done")
        got = await ok(s, "read_messages")
        assert [m["message_id"] for m in got["messages"]] == [sent["message_id"]]
        assert (await ok(s, "read_messages", ack=[sent["message_id"]]))["acked"] == 1
        await ok(s, "broadcast", content="job done", ttl_s=60)
        agents = (await ok(s, "get_agent_status"))["agents"]
        assert [(a["name"], a["unread"]) for a in agents] == [("tester", 0)]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(10) == 0


async def test_bad_tool_arguments_are_tool_errors_and_change_nothing(daemon):
    async with mcp_session(daemon.socket) as s:
        text = await tool_error(s, "enqueue_job", kind="k", required_role="cpu", priority=7)
        assert text.startswith("bad_request: enqueue_job: priority: 7 is greater than the "
                               "maximum of 3"), text
        text = await tool_error(s, "enqueue_job", required_role="cpu", priority=1)
        assert text == "bad_request: enqueue_job: 'kind' is a required property", text
        text = await tool_error(s, "enqueue_job", kind="k", required_role="cpu", priority=1,
                                prio=2)
        assert text.startswith("bad_request: enqueue_job: Additional properties are not "
                               "allowed ('prio' was unexpected)"), text
        text = await tool_error(s, "get_job", job_id=42)
        assert text == "bad_request: get_job: job_id: 42 is not of type 'string'", text
        text = await tool_error(s, "wait_for_job", job_id="x", timeout_s=3600)
        assert "timeout_s: 3600 is greater than the maximum of 300" in text, text
        text = await tool_error(s, "send_message", recipient="", content="hi")
        assert text.startswith("bad_request: send_message: recipient:"), text
        text = await tool_error(s, "read_messages", limit=0)
        assert text.startswith("bad_request: read_messages: limit:"), text
        text = await tool_error(s, "update_agent_status", status="")
        assert text.startswith("bad_request: update_agent_status: status:"), text
        # past the schema: coordd's own checks, with coordd's codes
        text = await tool_error(s, "send_message", recipient="b", content="x" * (300 << 10))
        assert text.startswith("payload_too_large: content is "), text
        text = await tool_error(s, "get_job", job_id="nosuchjob")
        assert text == "not_found: job nosuchjob not found", text
        text = await tool_error(s, "cancel_job", job_id="nosuchjob")
        assert text.startswith("not_found:"), text
        text = await tool_error(s, "no_such_tool")
        assert text == "unknown_method: no tool named 'no_such_tool'", text
        assert (await ok(s, "coordinator_status"))["jobs"]["waiting"] == 0
    assert _counts(daemon.db) == (0, 0, 0)


async def test_admin_tools_refused_for_a_launching_uid_outside_the_admin_set(daemon_factory):
    """coordd-mcp acts with its launcher's uid (SO_PEERCRED): with admin_uids set to a uid
    that is not ours, enqueue and cancel are refused; the non-admin tools still work."""
    other = os.getuid() + 4242
    d = daemon_factory(f"admin_uids = [{other}]\n")
    d.start()
    async with mcp_session(d.socket) as s:
        text = await tool_error(s, "enqueue_job", kind="k", required_role="cpu", priority=1)
        assert text.startswith(f"permission_denied: enqueue is an admin method; uid "
                               f"{os.getuid()} is not in the admin set"), text
        text = await tool_error(s, "cancel_job", job_id="anything")
        assert text.startswith("permission_denied: cancel is an admin method"), text
        text = await tool_error(s, "retry_job", job_id="anything")
        assert text.startswith("permission_denied: retry is an admin method"), text
        text = await tool_error(s, "submit_workflow", name="w", nodes=[
            {"name": "a", "kind": "k", "required_role": "cpu"}])
        assert text.startswith("permission_denied: workflow_submit is an admin method"), text
        assert (await ok(s, "list_workers"))["workers"] == []  # read-only: allowed
        await ok(s, "send_message", recipient="lead", content="cannot enqueue: not admin")
        assert (await ok(s, "coordinator_status"))["jobs"]["waiting"] == 0
    assert _counts(d.db) == (0, 1, 0)


async def test_tool_error_when_coordd_is_not_running(tmp_path):
    async with mcp_session(str(tmp_path / "absent.sock")) as s:
        text = await tool_error(s, "coordinator_status")
        assert text.startswith("disconnected: coordd is not running at "), text


async def test_the_server_reconnects_after_coordd_restarts(daemon):
    async with mcp_session(daemon.socket) as s:
        await ok(s, "send_message", recipient="tester", content="before", message_id="m-1")
        daemon.kill()
        text = await tool_error(s, "coordinator_status")
        assert text.startswith("disconnected:"), text
        daemon.start()
        got = await ok(s, "read_messages", ack_on_read=True)
        assert [m["content"] for m in got["messages"]] == ["before"]


async def test_send_message_names_its_recipient_to_like_the_cli_with_recipient_as_alias(daemon):
    async with mcp_session(daemon.socket, agent="lead") as s:
        a = await ok(s, "send_message", to="coder", content="review PR 7")
        b = await ok(s, "send_message", recipient="coder", content="old name still works")
        c = await ok(s, "send_message", to="coder", recipient="coder", content="same agent")
        text = await tool_error(s, "send_message", content="to whom?")
        assert text == "bad_request: send_message: 'to' is a required property", text
        text = await tool_error(s, "send_message", to="coder", recipient="tester", content="x")
        assert text.startswith("bad_request: send_message: to 'coder' and its alias "
                               "recipient 'tester' name different agents"), text
        text = await tool_error(s, "send_message", to="", content="x")
        assert text.startswith("bad_request: send_message: to:"), text
    async with mcp_session(daemon.socket, agent="coder") as s:
        got = (await ok(s, "read_messages", ack_on_read=True))["messages"]
        assert [m["message_id"] for m in got] == [a["message_id"], b["message_id"],
                                                  c["message_id"]]
        assert {m["sender"] for m in got} == {"lead"}
    assert _counts(daemon.db) == (0, 3, 0)


async def test_retry_job_list_workers_submit_and_get_workflow(daemon):
    from coordd.client import Client
    async with Client(daemon.socket, timeout=10) as c, mcp_session(daemon.socket) as s:
        await c.heartbeat("w1", ["cpu"], COOL)
        workers = (await ok(s, "list_workers"))["workers"]
        assert [(w["worker_id"], w["roles"], w["live"]) for w in workers] == [("w1", ["cpu"], True)]
        assert workers[0]["verdicts"]["p0"] == []

        job = (await ok(s, "enqueue_job", kind="k", required_role="cpu", priority=1,
                        max_attempts=1))["job_id"]
        got = await c.claim("w1", 30)
        assert got.job.job_id == job
        await c.fail(job, "w1", got.lease.token, "boom", False)
        assert (await ok(s, "get_job", job_id=job))["status"] == "failed"
        retried = await ok(s, "retry_job", job_id=job)
        assert (retried["job_id"], retried["status"]) == (job, "waiting")
        text = await tool_error(s, "retry_job", job_id=job)  # waiting: nothing to retry
        assert text.startswith("invalid_state:"), text

        graph = {"name": "story", "idempotency_key": "story-1", "nodes": [
            {"name": "gather", "kind": "k", "required_role": "cpu", "payload": {"m": "json"}},
            {"name": "build", "kind": "k", "required_role": "cpu",
             "needs": [{"node": "gather", "policy": "run"}]}]}
        sub = await ok(s, "submit_workflow", **graph)
        assert sub["created"] is True and set(sub["jobs"]) == {"gather", "build"}
        again = await ok(s, "submit_workflow", **graph)
        assert (again["workflow_id"], again["created"]) == (sub["workflow_id"], False)
        wf = await ok(s, "get_workflow", workflow_id=sub["workflow_id"])
        assert wf["name"] == "story" and wf["status"] == "running"
        states = {n["name"]: n["status"] for n in wf["nodes"]}
        assert states == {"gather": "waiting", "build": "blocked"}

        text = await tool_error(s, "submit_workflow", name="x", nodes=[
            {"name": "a", "kind": "k", "required_role": "cpu", "need": ["b"]}])
        assert text.startswith("bad_request: submit_workflow: nodes.0: Additional properties "
                               "are not allowed ('need' was unexpected)"), text
        text = await tool_error(s, "submit_workflow", name="x", nodes=[
            {"name": "a", "kind": "k", "required_role": "cpu", "needs": ["b"]},
            {"name": "b", "kind": "k", "required_role": "cpu", "needs": ["a"]}])
        assert text.startswith("bad_request:") and "cycle" in text, text
        text = await tool_error(s, "get_workflow", workflow_id="nosuch")
        assert text.startswith("not_found:"), text
    assert _counts(daemon.db)[0] == 3


async def test_enqueue_job_takes_resources_as_enqueue_does(daemon):
    async with mcp_session(daemon.socket) as s:
        job = await ok(s, "enqueue_job", kind="embed", required_role="gpu", priority=1,
                       resources={"vram_mb": 8000, "ram_mb": 2000})
        view = await ok(s, "get_job", job_id=job["job_id"])
        assert view["resources"] == {"gpus": 1, "vram_mb": 8000, "ram_mb": 2000}
        text = await tool_error(s, "enqueue_job", kind="k", required_role="gpu", priority=1,
                                resources={"vram": 1})
        assert text.startswith("bad_request: enqueue_job: resources: Additional properties"), text
        text = await tool_error(s, "enqueue_job", kind="k", required_role="gpu", priority=1,
                                resources={"gpus": 65})
        assert "resources.gpus: 65 is greater than the maximum of 64" in text, text
    assert _counts(daemon.db)[0] == 1  # the refused ones stored nothing


LIMIT_CASES = [  # (limits, accepted): what coordd's enqueue accepts, the tool accepts
    (["openai"], True), ([{"name": "openai", "units": 3}], True), ([], True),
    ([{"name": "openai"}], True),
    ([{"name": "openai", "units": 0}], False), ([{"name": "openai", "units": 9}], False),
    (["nosuch"], False), (["openai", {"name": "openai", "units": 2}], False),
    ([{"name": "openai", "units": 1.5}], False), ([{"name": "openai", "units": True}], False),
    ([{"units": 1}], False), ("openai", False), ([7], False),
]


async def test_enqueue_job_takes_limits_and_refuses_what_enqueue_refuses(daemon_factory):
    d = daemon_factory("[limits.openai]\nconcurrency = 8\n")
    d.start()
    from coordd.client import Client
    from coordd.errors import CoordError
    async with mcp_session(d.socket) as s, Client(d.socket, timeout=10) as c:
        for limits, accepted in LIMIT_CASES:
            fields = {"kind": "chat", "required_role": "cpu", "priority": 1, "limits": limits}
            try:
                await c.call("enqueue", fields)
                rpc_ok = True
            except CoordError as exc:
                rpc_ok = False
                assert exc.code == "bad_request", exc
            res = await s.call_tool("enqueue_job", fields)
            assert (rpc_ok, not res.isError) == (accepted, accepted), (limits, res.content)
            if res.isError:
                assert res.content[0].text.startswith("bad_request: "), res.content[0].text
            else:
                view = await ok(s, "get_job", job_id=res.structuredContent["job_id"])
                want = [{"name": x, "units": 1} if isinstance(x, str) else {"units": 1, **x}
                        for x in limits]
                assert view["limits"] == want, view["limits"]
        text = await tool_error(s, "enqueue_job", kind="k", required_role="cpu", priority=1,
                                limits=["nosuch"])
        assert "unknown limit 'nosuch' (known: openai)" in text, text  # coordd's own words
