"""The agent message hub on a pinned clock: delivery rule, broadcasts, expiry, validation."""

from __future__ import annotations

import sqlite3

import pytest

from coordd import errors
from coordd.wire.protocol import (
    AckMessages, AgentQuery, AgentStatusUpdate, BroadcastMessage, ReadMessages, SendMessage,
)
from coordd.service.reaper import Reaper


def _count(db_path: str, table: str = "messages") -> int:
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


async def send(b, sender="a", recipient="b", content="hi", **kw):
    return await b.coord.send_message(SendMessage(sender=sender, recipient=recipient,
                                                  content=content, **kw))


async def read(b, reader="b", **kw):
    return await b.coord.read_messages(ReadMessages(reader=reader, **kw))


async def test_direct_message_read_acked_is_not_delivered_again(bundle):
    sent = await send(bundle, content={"task": "review", "pr": 7}, message_type="request",
                      metadata={"thread": "t1"})
    assert sent.created and sent.expires_at is None
    got = await read(bundle)
    assert [m.message_id for m in got.messages] == [sent.message_id]
    m = got.messages[0]
    assert (m.sender, m.recipient, m.message_type, m.content, m.metadata, m.deliveries) == \
        ("a", "b", "request", {"task": "review", "pr": 7}, {"thread": "t1"}, 1)
    assert got.visible_until == bundle.clock.wall() + bundle.coord.config.message_visibility_s
    assert (await read(bundle)).messages == []  # hidden while the reader holds it
    again = await read(bundle, ack=[sent.message_id])
    assert again.acked == 1 and again.messages == []
    bundle.clock.advance(3600)
    assert (await read(bundle)).messages == []  # processed: never again
    assert (await read(bundle, reader="a")).messages == []  # not the sender's
    assert (await bundle.coord.ack_messages(AckMessages(reader="b",
                                                        message_ids=[sent.message_id]))).acked == 0


async def test_unacked_message_comes_back_after_visibility_timeout(bundle):
    """At least once: a reader that dies before acking gets the message again, same id."""
    sent = await send(bundle)
    first = await read(bundle, visibility_s=30)
    assert first.messages[0].deliveries == 1
    bundle.clock.advance(29)
    assert (await read(bundle)).messages == []
    bundle.clock.advance(1)
    second = await read(bundle)
    assert [(m.message_id, m.deliveries) for m in second.messages] == [(sent.message_id, 2)]
    assert (await bundle.coord.ack_messages(AckMessages(
        reader="b", message_ids=[sent.message_id]))).acked == 1
    bundle.clock.advance(60)
    assert (await read(bundle)).messages == []


async def test_ack_on_read_is_at_most_once(bundle):
    await send(bundle)
    assert len((await read(bundle, ack_on_read=True)).messages) == 1
    bundle.clock.advance(3600)
    assert (await read(bundle)).messages == []
    conn = sqlite3.connect(bundle.db_path)
    assert conn.execute("SELECT status, processed_at FROM messages").fetchone() == \
        ("processed", bundle.clock.wall() - 3600)
    conn.close()


async def test_inbox_order_p0_first_then_oldest_and_limit(bundle):
    ids = []
    for prio in (2, 2, 0, 3, 2):
        ids.append((await send(bundle, content=len(ids), priority=prio)).message_id)
        bundle.clock.advance(1)
    page = await read(bundle, limit=3)
    assert [m.message_id for m in page.messages] == [ids[2], ids[0], ids[1]]
    rest = await read(bundle, limit=10, ack=[m.message_id for m in page.messages])
    assert rest.acked == 3
    assert [m.message_id for m in rest.messages] == [ids[4], ids[3]]


async def test_broadcast_reaches_every_reader_once_but_not_its_sender(bundle):
    b = await bundle.coord.broadcast(BroadcastMessage(sender="lead", content="freeze merges",
                                                      priority=0))
    for reader in ("x", "y"):
        got = await read(bundle, reader=reader)
        assert [(m.message_id, m.recipient) for m in got.messages] == [(b.message_id, None)]
        assert (await read(bundle, reader=reader, ack=[b.message_id])).messages == []
    assert (await read(bundle, reader="lead")).messages == []
    late = await read(bundle, reader="z", ack_on_read=True)  # a reader arriving later
    assert [m.message_id for m in late.messages] == [b.message_id]
    bundle.clock.advance(3600)
    for reader in ("x", "y", "z", "lead"):
        assert (await read(bundle, reader=reader)).messages == []
    assert _count(bundle.db_path, "message_reads") == 3


async def test_expired_message_is_never_delivered_and_purged_by_the_maintenance_loop(bundle):
    gone = await send(bundle, content="stale soon", ttl_s=10)
    held = await send(bundle, content="read, not acked, then expires", ttl_s=40)
    live = await send(bundle, content="no expiry")
    bc = await bundle.coord.broadcast(BroadcastMessage(sender="a", content="x", ttl_s=10))
    assert gone.expires_at == bundle.clock.wall() + 10
    first = await read(bundle, reader="b", limit=1)  # P2 all: the oldest, `gone`
    assert [m.message_id for m in first.messages] == [gone.message_id]
    bundle.clock.advance(10)  # expires_at <= now: expired
    got = await read(bundle, visibility_s=5)
    assert [m.message_id for m in got.messages] == [held.message_id, live.message_id]
    assert (await read(bundle, reader="c")).messages == []  # the broadcast expired too
    bundle.clock.advance(30)  # `held` expired while the reader held it: never redelivered
    assert [m.message_id for m in (await read(bundle)).messages] == [live.message_id]
    assert _count(bundle.db_path) == 4
    reaper = Reaper(bundle.coord, bundle.clock, interval=1, prune_interval=60)
    res = await reaper.prune_if_due()  # the maintenance loop's prune round
    assert res is not None and res.messages == 3
    assert _count(bundle.db_path) == 1 and _count(bundle.db_path, "message_reads") == 1
    assert bc.message_id != live.message_id


async def test_retention_purges_processed_messages_and_old_broadcasts(make_bundle):
    b = await make_bundle(message_retention_s=100)
    done = await send(b)
    await read(b, ack_on_read=True)
    await b.coord.broadcast(BroadcastMessage(sender="a", content="old news"))
    waiting = await send(b, content="unread stays however old")
    b.clock.advance(101)
    assert (await b.coord.prune()).messages == 2
    assert [m.message_id for m in (await read(b)).messages] == [waiting.message_id]
    assert done.message_id != waiting.message_id


async def test_resend_with_the_same_message_id_is_stored_once(bundle):
    a = await send(bundle, message_id="req-1")
    again = await send(bundle, message_id="req-1")
    assert (a.created, again.created, again.message_id) == (True, False, "req-1")
    with pytest.raises(errors.BadRequest, match="already used"):
        await send(bundle, sender="mallory", message_id="req-1")
    assert len((await read(bundle)).messages) == 1


@pytest.mark.parametrize("kw, error", [
    ({"sender": ""}, errors.BadRequest),
    ({"recipient": "x" * 201}, errors.BadRequest),
    ({"recipient": "bad\nname"}, errors.BadRequest),
    ({"priority": 4}, errors.BadRequest),
    ({"message_type": ""}, errors.BadRequest),
    ({"ttl_s": 0}, errors.BadRequest),
    ({"ttl_s": float("nan")}, errors.BadRequest),
    ({"content": "x" * (256 << 10)}, errors.PayloadTooLarge),
    ({"metadata": {"k": "x" * (256 << 10)}}, errors.PayloadTooLarge),
])
async def test_bad_messages_are_refused_and_nothing_is_stored(bundle, kw, error):
    with pytest.raises(error):
        await send(bundle, **kw)
    assert _count(bundle.db_path) == 0


@pytest.mark.parametrize("kw", [{"limit": 0}, {"limit": 101}, {"visibility_s": 0},
                                {"visibility_s": float("nan")}, {"reader": ""},
                                {"ack": ["x"] * 1001}])
async def test_bad_reads_are_refused_and_change_nothing(bundle, kw):
    await send(bundle)
    with pytest.raises(errors.BadRequest):
        await read(bundle, **kw)
    assert _count(bundle.db_path, "message_reads") == 0


async def test_agent_status_heartbeat_liveness_and_unread(bundle):
    with pytest.raises(errors.NotFound):
        await bundle.coord.get_agent_status(AgentQuery(name="coder"))
    view = await bundle.coord.update_agent_status(AgentStatusUpdate(
        name="coder", status="busy", metadata={"task": "issue 9"}))
    assert (view.status, view.metadata, view.live, view.unread) == \
        ("busy", {"task": "issue 9"}, True, 0)
    await send(bundle, recipient="coder")
    await bundle.coord.broadcast(BroadcastMessage(sender="coder", content="mine"))
    await bundle.coord.broadcast(BroadcastMessage(sender="lead", content="all"))
    bundle.clock.advance(bundle.coord.config.agent_stale_s + 1)
    await bundle.coord.update_agent_status(AgentStatusUpdate(name="monitor", status="idle"))
    agents = {a.name: a for a in (await bundle.coord.get_agent_status(AgentQuery())).agents}
    assert agents["coder"].live is False and agents["coder"].unread == 2
    assert agents["coder"].metadata == {"task": "issue 9"}
    assert agents["monitor"].live is True and agents["monitor"].unread == 2
    kept = await bundle.coord.update_agent_status(AgentStatusUpdate(name="coder", status="idle"))
    assert kept.metadata == {"task": "issue 9"} and kept.live and kept.first_seen_at == view.first_seen_at
    with pytest.raises(errors.BadRequest):
        await bundle.coord.update_agent_status(AgentStatusUpdate(name="coder", status=""))


async def test_a_read_reply_stays_within_its_byte_budget(make_bundle):
    """Large messages are handed out a few per read so the reply always fits a frame; the
    rest wait, undelivered, for the next read."""
    b = await make_bundle(max_frame_bytes=1 << 20)  # budget: half the frame cap, encoded
    big = "x" * (200 << 10)
    ids = [(await send(b, content=big + str(i))).message_id for i in range(3)]
    first = await read(b, limit=10)
    assert [m.message_id for m in first.messages] == ids[:2]
    second = await read(b, limit=10, ack=ids[:2])
    assert [m.message_id for m in second.messages] == ids[2:]
    assert second.messages[0].deliveries == 1


async def test_ack_only_counts_the_readers_own_deliveries(bundle):
    sent = await send(bundle)
    await read(bundle)
    other = await bundle.coord.ack_messages(AckMessages(reader="c", message_ids=[sent.message_id]))
    unknown = await bundle.coord.ack_messages(AckMessages(reader="b", message_ids=["nope"]))
    assert (other.acked, unknown.acked) == (0, 0)
    assert (await bundle.coord.ack_messages(
        AckMessages(reader="b", message_ids=[sent.message_id, sent.message_id]))).acked == 1


def test_a_v2_database_gains_the_hub_tables_on_upgrade(tmp_path):
    from coordd import store
    from coordd.store import schema
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    try:
        for script in schema.MIGRATIONS[:2]:  # a database written by the previous coordd
            for stmt in schema._split(script):
                conn.execute(stmt)
        conn.execute("PRAGMA user_version = 2")
        assert store.migrate(conn) == store.SCHEMA_VERSION
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"jobs", "messages", "message_reads", "agents"} <= tables
    finally:
        conn.close()
