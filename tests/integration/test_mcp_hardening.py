"""coordd-mcp (a real subprocess, through the SDK's stdio client) against values it cannot
send: deep nesting refused by coordd, a stored value too deep for the SDK's serializer (a
database written before the cap), integers msgpack cannot carry. Each is one tool error;
the server keeps serving."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from datetime import timedelta
from typing import Any

from coordd.client import Client
from tests.integration.test_mcp import _coordd_mcp, mcp_session

CALL_TIMEOUT = timedelta(seconds=20)  # a server that died never answers: fail, not hang


async def ok(session: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    res = await session.call_tool(tool, arguments, read_timeout_seconds=CALL_TIMEOUT)
    assert not res.isError, res.content[0].text
    return res.structuredContent


async def tool_error(session: Any, tool: str, **arguments: Any) -> str:
    res = await session.call_tool(tool, arguments, read_timeout_seconds=CALL_TIMEOUT)
    assert res.isError, res
    return res.content[0].text


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _write_behind_coordd(db: str, sql: str, params: tuple) -> None:
    """Change the live database as an older coordd (without the depth cap) could have."""
    conn = sqlite3.connect(db, timeout=10)
    try:
        conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


async def test_values_too_deep_are_tool_errors_and_the_server_keeps_serving(daemon):
    async with Client(daemon.socket) as c:
        job = await c.enqueue(kind="k", required_role="cpu", priority=1, payload={"n": 1})
    deep = json.dumps({"d": nested(300)})
    _write_behind_coordd(daemon.db, "UPDATE jobs SET payload_json = ? WHERE job_id = ?",
                         (deep, job.job_id))
    _write_behind_coordd(
        daemon.db, "INSERT INTO messages (message_id, sender, recipient, message_type, "
        "content, priority, status, created_at) VALUES ('old-1', 'a', 'tester', 'text', ?, 2, "
        "'pending', ?)", (deep, time.time()))
    async with mcp_session(daemon.socket) as s:
        text = await tool_error(s, "get_job", job_id=job.job_id)
        assert text.startswith("internal: get_job: the result cannot be sent over MCP"), text
        text = await tool_error(s, "read_messages")
        assert text.startswith("internal: read_messages: the result cannot be sent"), text
        assert (await ok(s, "coordinator_status"))["jobs"]["waiting"] == 1  # still serving

        # new deep values are refused by coordd, the field named, nothing stored (past
        # ~250 levels the SDK itself cannot parse the request, and drops it)
        text = await tool_error(s, "send_message", recipient="b", content=nested(100))
        assert text == "bad_request: content nests deeper than 64 levels of arrays/objects", text
        text = await tool_error(s, "update_agent_status", status="idle",
                                metadata={"m": nested(100)})
        assert text.startswith("bad_request: metadata nests deeper than 64 levels"), text
        text = await tool_error(s, "enqueue_job", kind="k", required_role="cpu", priority=1,
                                payload=nested(100))
        assert text.startswith("bad_request: payload nests deeper than 64 levels"), text

        # integers msgpack cannot carry: bad_request, like any other bad argument
        for tool, args in (("send_message", {"recipient": "b", "content": 2 ** 70}),
                           ("broadcast", {"content": "x", "metadata": {"n": -(2 ** 70)}}),
                           ("enqueue_job", {"kind": "k", "required_role": "cpu",
                                            "priority": 1, "payload": [2 ** 64]})):
            text = await tool_error(s, tool, **args)
            assert text.startswith("bad_request: ") and "-2**63 .. 2**64-1" in text, text
        assert (await ok(s, "get_agent_status"))["agents"] == []
    async with Client(daemon.socket) as c:
        assert (await c.status()).jobs["waiting"] == 1
        assert (await c.read_messages("b")).messages == []


async def test_integer_fields_refuse_floats_in_the_schema_and_pages_of_agents(daemon):
    async with mcp_session(daemon.socket) as s:
        for tool, args, field in (
                ("send_message", {"recipient": "b", "content": "x", "priority": 1.0}, "priority"),
                ("read_messages", {"limit": 1.0}, "limit"),
                ("enqueue_job", {"kind": "k", "required_role": "cpu", "priority": 1,
                                 "max_attempts": 2.0}, "max_attempts")):
            text = await tool_error(s, tool, **args)
            assert text.startswith(f"bad_request: {tool}: {field}: ") and \
                "is not of type 'integer'" in text, text
        await ok(s, "update_agent_status", status="idle")
        page = await ok(s, "get_agent_status", limit=1)
        assert [a["name"] for a in page["agents"]] == ["tester"]
        tools = {t.name: t.inputSchema for t in (await s.list_tools()).tools}
        for name, schema in tools.items():
            for prop, spec in schema["properties"].items():
                assert spec.get("description"), (name, prop)
    assert subprocess.run([_coordd_mcp(), "--timeout", "0"], capture_output=True,
                          timeout=30).returncode == 2
