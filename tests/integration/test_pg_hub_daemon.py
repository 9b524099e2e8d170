"""The agent message hub served by a real coordd process on the PostgreSQL store (issue
20): every hub method over the socket with the SQLite path's replies and codes, messages
kept across a SIGKILL of coordd, the running daemon's purge, coordctl msg and agents."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from coordd import errors
from coordd.client import Client
from tests.integration.test_coordctl import ctl, ok, ok_json, refused
from tests.integration.test_pg_daemon import DAEMON_CFG, Coordd, pg_db  # noqa: F401 (fixture)
from tests.integration.workerbench import until


@pytest.fixture
def hub_coordd(pg_db: str, tmp_path: Path) -> Any:  # noqa: F811 (pg_db is the fixture)
    cfg = tmp_path / "hub.toml"
    cfg.write_text(DAEMON_CFG + "prune_interval_s = 0.3\nmessage_visibility_s = 30\n")
    d = Coordd(pg_db, str(tmp_path / "hub.sock"), str(cfg), tmp_path / "hub.log")
    yield d.start()
    d.stop()


async def _stored(dsn: str, message_id: str) -> int:
    import asyncpg
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT count(*) FROM messages WHERE message_id = $1",
                                   message_id)
    finally:
        await conn.close()


async def test_hub_methods_answer_on_the_postgres_daemon_across_a_sigkill(hub_coordd):
    d = hub_coordd
    await d.wait_serving()
    async with Client(d.socket, timeout=10) as c:
        news = await c.broadcast("lead", "freeze merges", priority=0)
        first = await c.send_message("alice", "bob", {"pr": 7}, message_id="alice-1",
                                     metadata={"thread": "t1"})
        assert (first.message_id, first.created, first.expires_at) == ("alice-1", True, None)
        brief = await c.send_message("alice", "bob", "only for a moment", ttl_s=0.2)
        got = await c.read_messages("bob", limit=1)
        assert [(m.message_id, m.deliveries, m.recipient) for m in got.messages] == \
            [(news.message_id, 1, None)]
        assert got.visible_until is not None and got.visible_until - got.messages[0].created_at \
            == pytest.approx(30, abs=5)
        await asyncio.sleep(0.3)  # `brief` expires: never delivered, purged by the daemon
        got = await c.read_messages("bob", ack=[news.message_id])
        assert got.acked == 1 and [m.message_id for m in got.messages] == ["alice-1"]
        assert got.messages[0].content == {"pr": 7} and got.messages[0].metadata == \
            {"thread": "t1"}
        await until(lambda: _gone(d.dsn, brief.message_id), 10, "the purge of the expired")
        view = await c.update_agent_status("bob", "busy", {"task": "PR 7"})
        assert (view.name, view.status, view.live, view.unread) == ("bob", "busy", True, 1)
        # bad input: the SQLite path's checks and codes, the daemon goes on
        with pytest.raises(errors.BadRequest, match="priority must be 0..3"):
            await c.send_message("alice", "bob", "x", priority=9)
        with pytest.raises(errors.BadRequest, match="already used by another message"):
            await c.send_message("mallory", "bob", "x", message_id="alice-1")
        with pytest.raises(errors.BadRequest, match="limit must be 1..100"):
            await c.read_messages("bob", limit=0)
        with pytest.raises(errors.NotFound, match="has never reported a status"):
            await c.get_agent_status("nobody")
        with pytest.raises(errors.BadRequest):
            await c.ack_messages("bob", ["bad\nid"])

    d.proc.send_signal(signal.SIGKILL)  # no drain: what was acknowledged is stored
    d.proc.wait(10)
    d.start()
    await d.wait_serving()
    async with Client(d.socket, timeout=10) as c:
        again = await c.send_message("alice", "bob", {"pr": 7}, message_id="alice-1")
        assert (again.created, again.message_id) == (False, "alice-1")  # a resend, stored once
        assert (await c.read_messages("bob")).messages == []  # held by bob's read
        assert (await c.ack_messages("bob", ["alice-1", "alice-1"])).acked == 1
        page = await c.get_agent_status()
        assert [(a.name, a.status, a.unread, a.metadata) for a in page.agents] == \
            [("bob", "busy", 0, {"task": "PR 7"})]
        assert [m.message_id for m in (await c.read_messages("carol")).messages] == \
            [news.message_id]  # a late reader still gets the broadcast

    sock = d.socket
    assert ok(ctl(sock, "msg", "send", "--from", "lead", "--to", "coder", "review PR 8",
                  "--id", "lead-1")).strip() == "lead-1"
    read = ok_json(ctl(sock, "--json", "msg", "read", "--as", "coder"))
    assert [m["content"] for m in read["messages"]] == ["freeze merges", "review PR 8"]  # P0 first
    assert [a["name"] for a in ok_json(ctl(sock, "--json", "agents"))["agents"]] == ["bob"]
    refused(ctl(sock, "agents", "nobody"), 1, "not_found")


async def _gone(dsn: str, message_id: str) -> bool:
    return await _stored(dsn, message_id) == 0
