"""The hub's bounds on a pinned clock: config vs read limits, resends, listing agents,
the byte budget of a read reply."""

from __future__ import annotations

import sqlite3

import msgspec
import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.wire.protocol import (
    AgentQuery, AgentStatusUpdate, BroadcastMessage, ReadMessages, SendMessage,
)
from coordd.store import messages as msg_store

_pack = msgspec.msgpack.encode


def _count(db_path: str, table: str) -> int:
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


async def test_a_resend_reports_the_stored_expiry_not_the_new_requests(bundle):
    first = await bundle.coord.send_message(SendMessage(sender="a", recipient="b",
                                                        content="x", ttl_s=60,
                                                        message_id="req-1"))
    bundle.clock.advance(30)
    again = await bundle.coord.send_message(SendMessage(sender="a", recipient="b",
                                                        content="x", ttl_s=60,
                                                        message_id="req-1"))
    assert (again.created, again.expires_at) == (False, first.expires_at)
    no_ttl = await bundle.coord.send_message(SendMessage(sender="a", recipient="b",
                                                         content="x", message_id="req-1"))
    assert (no_ttl.created, no_ttl.expires_at) == (False, first.expires_at)


@pytest.mark.parametrize("value", [43_201, 1e9, 0, -1, float("nan")])
def test_config_refuses_a_visibility_the_read_path_would_refuse(value):
    with pytest.raises(errors.ConfigError, match="message_visibility_s must be a finite number > 0 and <= 43200"):
        config_mod.load(None, message_visibility_s=value)


async def test_config_at_the_visibility_maximum_serves_default_reads(make_bundle):
    b = await make_bundle(message_visibility_s=43_200)
    await b.coord.send_message(SendMessage(sender="a", recipient="b", content="x"))
    got = await b.coord.read_messages(ReadMessages(reader="b"))
    assert got.visible_until == b.clock.wall() + 43_200


async def _status(b, name, metadata=None, status="idle"):
    return await b.coord.update_agent_status(AgentStatusUpdate(name=name, status=status,
                                                               metadata=metadata))


async def test_agents_are_listed_in_pages_by_name(bundle):
    for i in range(5):
        await _status(bundle, f"agent-{i}")
    first = await bundle.coord.get_agent_status(AgentQuery(limit=2))
    assert [a.name for a in first.agents] == ["agent-0", "agent-1"]
    assert first.next_after == "agent-1"
    rest = await bundle.coord.get_agent_status(AgentQuery(limit=100, after=first.next_after))
    assert [a.name for a in rest.agents] == ["agent-2", "agent-3", "agent-4"]
    assert rest.next_after is None
    assert len((await bundle.coord.get_agent_status(AgentQuery())).agents) == 5
    for bad in (0, 1001):
        with pytest.raises(errors.BadRequest, match="limit must be 1..1000"):
            await bundle.coord.get_agent_status(AgentQuery(limit=bad))


async def test_agent_metadata_is_capped_so_a_page_fits_a_frame(make_bundle):
    b = await make_bundle(max_frame_bytes=256 << 10)  # a page may take half: 128 KiB
    with pytest.raises(errors.PayloadTooLarge, match="metadata is"):
        await _status(b, "big", {"blob": "x" * (16 << 10)})
    assert _count(b.db_path, "agents") == 0
    for i in range(30):
        await _status(b, f"a{i:02d}", {"blob": "😀" * 3500})  # ~14 KiB each
    seen, after, pages = [], None, 0
    while True:
        page = await b.coord.get_agent_status(AgentQuery(limit=1000, after=after))
        assert len(_pack(page)) <= (256 << 10) // 2 + 1024
        seen += [a.name for a in page.agents]
        pages += 1
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == [f"a{i:02d}" for i in range(30)] and pages >= 4


async def test_agents_not_heard_from_for_the_retention_are_forgotten(make_bundle):
    b = await make_bundle(message_retention_s=1000)
    await _status(b, "gone")
    await b.coord.send_message(SendMessage(sender="x", recipient="gone", content="kept"))
    b.clock.advance(600)
    await _status(b, "active")
    b.clock.advance(401)
    assert (await b.coord.prune()).agents == 1
    assert [a.name for a in (await b.coord.get_agent_status(AgentQuery())).agents] == ["active"]
    assert len((await b.coord.read_messages(ReadMessages(reader="gone"))).messages) == 1


async def test_unread_counts_what_a_read_would_still_hand_over(bundle):
    await _status(bundle, "me")
    await bundle.coord.broadcast(BroadcastMessage(sender="me", content="mine"))
    acked = await bundle.coord.broadcast(BroadcastMessage(sender="lead", content="1"))
    await bundle.coord.broadcast(BroadcastMessage(sender="lead", content="2"))
    await bundle.coord.broadcast(BroadcastMessage(sender="lead", content="3", ttl_s=5))
    await bundle.coord.send_message(SendMessage(sender="lead", recipient="me", content="d"))
    await bundle.coord.send_message(SendMessage(sender="lead", recipient="you", content="d"))

    async def unread() -> int:
        return (await bundle.coord.get_agent_status(AgentQuery(name="me"))).agents[0].unread

    assert await unread() == 4
    got = await bundle.coord.read_messages(ReadMessages(reader="me", limit=1))
    assert got.messages[0].message_id == acked.message_id
    assert await unread() == 4  # delivered, held, not acked: still unread
    await bundle.coord.read_messages(ReadMessages(reader="me", limit=1, ack=[acked.message_id]))
    assert await unread() == 3
    bundle.clock.advance(5)  # the TTL'd broadcast expired
    assert await unread() == 2


async def test_listing_agents_does_not_scan_every_broadcast_per_agent(bundle):
    """The cost of a listing grows with agents plus broadcasts, not their product (1000
    agents x 47k broadcasts took 18 s): counted in SQLite VM steps."""
    conn = sqlite3.connect(bundle.db_path, timeout=10)
    conn.executemany("INSERT INTO messages (message_id, sender, recipient, message_type, "
                     "content, priority, status, created_at) VALUES (?, 'lead', NULL, 'text', "
                     "'1', 2, 'pending', 1.0)", [(f"b{i}",) for i in range(3000)])
    conn.executemany("INSERT INTO agents VALUES (?, 'idle', NULL, 100.0, 100.0)",
                     [(f"agent-{i:04d}",) for i in range(400)])
    conn.commit()

    def steps(limit: int) -> int:
        n = [0]
        conn.set_progress_handler(lambda: n.__setitem__(0, n[0] + 1), 100)
        rows = msg_store.agents(conn, 200.0, None, None, limit)
        conn.set_progress_handler(None, 100)
        assert len(rows) == limit and rows[0][5] == 3000
        return n[0]

    few, many = steps(100), steps(400)
    conn.close()
    assert many < 2 * few, (few, many)  # 4x the agents: far less than 4x the work


async def test_the_read_budget_counts_encoded_bytes_not_characters(bundle):
    """64 messages of 65,534 emoji are 256 KiB of characters but 16 MiB of UTF-8: a read
    of 100 hands out what fits 4 MiB, and the reply always fits the frame (it was built
    and committed, then refused as payload_too_large, again on every retry)."""
    emoji = "😀" * 65_534
    ids = [(await bundle.coord.send_message(SendMessage(sender="a", recipient="b",
                                                        content=emoji))).message_id
           for _ in range(64)]
    got, seen = [], []
    while len(seen) < 64:
        res = await bundle.coord.read_messages(ReadMessages(reader="b", limit=100, ack=got))
        reply = _pack({"id": 1, "result": res})
        assert len(reply) <= min(4 << 20, bundle.coord.config.max_frame_bytes // 2) + 1024
        assert res.messages and all(m.deliveries == 1 for m in res.messages)
        got = [m.message_id for m in res.messages]
        seen += got
    assert seen == ids


async def test_a_message_whose_encoding_would_not_fit_a_read_is_refused(make_bundle):
    b = await make_bundle(max_frame_bytes=64 << 10, message_max_bytes=64 << 10)
    floats = [0.0] * 4000  # 16 KB of JSON, 36 KB of msgpack
    with pytest.raises(errors.PayloadTooLarge, match="encoded"):
        await b.coord.send_message(SendMessage(sender="a", recipient="b", content=floats))
    assert _count(b.db_path, "messages") == 0
