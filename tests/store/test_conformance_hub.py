"""The agent message hub over both stores (coordd.store.api_hub): the rules of
tests/unit/test_hub_rules.py and test_hub_limits.py with a pinned `now`, the checks
through coordd.service.hub.Hub over each store, the same replies and errors from SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import secrets

import msgspec
import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.service.hub import Hub
from coordd.wire.protocol import (
    AckMessages, AgentQuery, AgentStatusUpdate, BroadcastMessage, ReadMessages, SendMessage,
)
from coordd.jsontext import dumps
from coordd.store.messages import NewMessage
from tests.store.conftest import T0

FAR = T0 + 10 * 86400.0
FRAME = 16 << 20
VIS = 60.0
_pack = msgspec.msgpack.encode


def hub(b, **overrides) -> Hub:
    return Hub(b.store, config_mod.load(None, **overrides))


def new(sender="a", recipient="b", content="hi", message_id=None, priority=2,
        message_type="text", metadata=None) -> NewMessage:
    return NewMessage(message_id=message_id or secrets.token_hex(8), sender=sender,
                      recipient=recipient, message_type=message_type,
                      content_json=dumps(content), priority=priority,
                      metadata_json=None if metadata is None else dumps(metadata),
                      expires_at=None)


async def send(b, now=T0, ttl_s=None, **kw):
    return await b.store.send_message(new(**kw), ttl_s, now=now)


async def broadcast(b, now=T0, sender="lead", **kw):
    return await send(b, now, sender=sender, recipient=None, **kw)


async def read(b, now=T0, reader="b", limit=10, visibility_s=VIS, ack_on_read=False, ack=(),
               frame=FRAME):
    return await b.store.read_messages(reader, limit, visibility_s, ack_on_read, list(ack),
                                       frame, now=now)


async def ids(b, now, reader="b", **kw) -> list[str]:
    return [m.message_id for m in (await read(b, now, reader, **kw)).messages]


async def test_direct_message_read_acked_is_not_delivered_again(bundle):
    sent = await send(bundle, content={"task": "review", "pr": 7}, message_type="request",
                      metadata={"thread": "t1"})
    assert sent.created and sent.expires_at is None
    got = await read(bundle, T0 + 1)
    assert [m.message_id for m in got.messages] == [sent.message_id]
    m = got.messages[0]
    assert (m.sender, m.recipient, m.message_type, m.content, m.metadata, m.deliveries,
            m.created_at, m.expires_at, m.priority) == \
        ("a", "b", "request", {"task": "review", "pr": 7}, {"thread": "t1"}, 1, T0, None, 2)
    assert (got.acked, got.visible_until) == (0, T0 + 1 + VIS)
    assert await ids(bundle, T0 + 2) == []  # hidden while the reader holds it
    again = await read(bundle, T0 + 3, ack=[sent.message_id])
    assert again.acked == 1 and again.messages == [] and again.visible_until is None
    assert await ids(bundle, FAR) == []  # processed: never again
    assert await ids(bundle, FAR, reader="a") == []  # not the sender's
    assert await bundle.store.ack_messages("b", [sent.message_id], now=FAR) == 0


async def test_unacked_message_comes_back_after_visibility_timeout(bundle):
    """At least once: a reader that dies before acking gets the message again, same id;
    `visible_at <= now` is visible again."""
    sent = await send(bundle)
    assert (await read(bundle, T0, visibility_s=30)).messages[0].deliveries == 1
    assert await ids(bundle, T0 + 29.999) == []
    second = await read(bundle, T0 + 30)
    assert [(m.message_id, m.deliveries) for m in second.messages] == [(sent.message_id, 2)]
    assert await bundle.store.ack_messages("b", [sent.message_id], now=T0 + 31) == 1
    assert await ids(bundle, FAR) == []


async def test_ack_on_read_is_at_most_once(bundle):
    await send(bundle)
    got = await read(bundle, ack_on_read=True)
    assert len(got.messages) == 1 and got.visible_until is None
    assert await ids(bundle, FAR) == []


async def test_inbox_order_p0_first_then_oldest_then_sent_first_and_limit(bundle):
    sent = []
    for i, prio in enumerate((2, 2, 0, 3, 2)):
        sent.append((await send(bundle, T0 + i, content=i, priority=prio)).message_id)
    same = [(await send(bundle, T0 + 9, content="same instant", message_id=f"m{k}")).message_id
            for k in (3, 1, 2)]  # one instant: in the order they were sent, not by id
    page = await read(bundle, T0 + 10, limit=3)
    assert [m.message_id for m in page.messages] == [sent[2], sent[0], sent[1]]
    rest = await read(bundle, T0 + 11, limit=10, ack=[m.message_id for m in page.messages])
    assert rest.acked == 3
    assert [m.message_id for m in rest.messages] == [sent[4], *same, sent[3]]


async def test_broadcast_reaches_every_reader_once_but_not_its_sender(bundle):
    b = await broadcast(bundle, content="freeze merges", priority=0)
    for reader in ("x", "y"):
        got = await read(bundle, T0 + 1, reader=reader)
        assert [(m.message_id, m.recipient) for m in got.messages] == [(b.message_id, None)]
        assert await ids(bundle, T0 + 2, reader, ack=[b.message_id]) == []
    assert await ids(bundle, T0 + 2, "lead") == []
    assert await ids(bundle, T0 + 3, "z", ack_on_read=True) == [b.message_id]  # a late reader
    for reader in ("x", "y", "z", "lead"):
        assert await ids(bundle, FAR, reader) == []
    # a reader that did not ack gets it again after the timeout, the others never
    await read(bundle, T0 + 4, reader="w")
    assert [(m.message_id, m.deliveries) for m in (await read(
        bundle, T0 + 4 + VIS, reader="w")).messages] == [(b.message_id, 2)]


async def test_expired_message_is_never_delivered_and_purged(bundle):
    gone = await send(bundle, ttl_s=10, content="stale soon")
    held = await send(bundle, ttl_s=40, content="read, not acked, then expires")
    live = await send(bundle, content="no expiry")
    await broadcast(bundle, ttl_s=10, sender="a", content="x")
    assert gone.expires_at == T0 + 10
    assert await ids(bundle, T0, limit=1) == [gone.message_id]
    got = await read(bundle, T0 + 10, visibility_s=5)  # expires_at <= now: expired
    assert [m.message_id for m in got.messages] == [held.message_id, live.message_id]
    assert await ids(bundle, T0 + 10, "c") == []  # the broadcast expired too
    # `held` expired while the reader held it: never delivered again
    assert await ids(bundle, T0 + 40) == [live.message_id]
    assert await hub(bundle).purge(now=T0 + 40) == 3
    assert await hub(bundle).purge(now=T0 + 40) == 0
    assert await ids(bundle, T0 + 40 + VIS) == [live.message_id]  # kept, with its delivery


async def test_retention_purges_processed_messages_and_old_broadcasts(bundle):
    h = hub(bundle, message_retention_s=100)
    await send(bundle)
    await read(bundle, ack_on_read=True)
    await broadcast(bundle, content="old news")
    waiting = await send(bundle, content="unread stays however old")
    assert await h.purge(now=T0 + 100) == 0  # processed at T0: not before the cutoff
    assert await h.purge(now=T0 + 101) == 2
    assert await ids(bundle, T0 + 101) == [waiting.message_id]


async def test_resend_with_the_same_message_id_is_stored_once(bundle):
    first = await send(bundle, ttl_s=60, message_id="req-1")
    again = await send(bundle, T0 + 30, ttl_s=60, message_id="req-1")
    no_ttl = await send(bundle, T0 + 31, message_id="req-1")
    assert (first.created, again.created, no_ttl.created) == (True, False, False)
    assert again.expires_at == no_ttl.expires_at == first.expires_at == T0 + 60
    with pytest.raises(errors.BadRequest, match="message_id req-1 is already used"):
        await send(bundle, sender="mallory", message_id="req-1")
    with pytest.raises(errors.BadRequest, match="already used"):
        await broadcast(bundle, sender="a", message_id="req-1")
    assert len((await read(bundle, T0 + 32)).messages) == 1


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
    p = {"sender": "a", "recipient": "b", "content": "hi", **kw}
    with pytest.raises(error):
        await hub(bundle).send_message(SendMessage(**p))
    for reader in ("b", "someone"):
        assert await ids(bundle, FAR, reader) == []


@pytest.mark.parametrize("kw", [{"limit": 0}, {"limit": 101}, {"visibility_s": 0},
                                {"visibility_s": float("nan")}, {"reader": ""},
                                {"ack": ["x"] * 1001}, {"ack": ["bad\nid"]}])
async def test_bad_reads_are_refused_and_change_nothing(bundle, kw):
    await send(bundle)
    with pytest.raises(errors.BadRequest):
        await hub(bundle).read_messages(ReadMessages(**{"reader": "b", **kw}))
    got = await read(bundle, T0 + 1)
    assert [m.deliveries for m in got.messages] == [1]  # never delivered before


async def test_agent_status_heartbeat_liveness_and_unread(bundle):
    st, stale = bundle.store, 300.0
    with pytest.raises(errors.NotFound, match="agent coder has never reported a status"):
        await hub(bundle).get_agent_status(AgentQuery(name="coder"))
    assert await st.agents("coder", None, 100, stale, now=T0) == []
    await st.update_agent("coder", "busy", dumps({"task": "issue 9"}), now=T0)
    [view] = await st.agents("coder", None, 100, stale, now=T0)
    assert (view.status, view.metadata, view.live, view.unread, view.heartbeat_at,
            view.heartbeat_age_s, view.first_seen_at) == \
        ("busy", {"task": "issue 9"}, True, 0, T0, 0.0, T0)
    await send(bundle, recipient="coder")
    await broadcast(bundle, sender="coder", content="mine")
    await broadcast(bundle, content="all")
    t = T0 + stale + 1
    await st.update_agent("monitor", "idle", None, now=t)
    agents = {a.name: a for a in await st.agents(None, None, 100, stale, now=t)}
    assert list(agents) == ["coder", "monitor"]
    assert (agents["coder"].live, agents["coder"].unread, agents["coder"].heartbeat_age_s) == \
        (False, 2, stale + 1)
    assert agents["coder"].metadata == {"task": "issue 9"}
    assert (agents["monitor"].live, agents["monitor"].unread) == (True, 2)
    [edge] = await st.agents("monitor", None, 100, stale, now=t + stale)
    assert edge.live  # heard from exactly agent_stale_s ago: still live
    await st.update_agent("coder", "idle", None, now=t + 1)
    [kept] = await st.agents("coder", None, 100, stale, now=t + 1)
    assert (kept.metadata, kept.live, kept.first_seen_at, kept.heartbeat_at) == \
        ({"task": "issue 9"}, True, T0, t + 1)
    via_hub = await hub(bundle).update_agent_status(AgentStatusUpdate(name="coder",
                                                                      status="done"))
    assert (via_hub.status, via_hub.metadata, via_hub.first_seen_at) == \
        ("done", {"task": "issue 9"}, T0)
    with pytest.raises(errors.BadRequest):
        await hub(bundle).update_agent_status(AgentStatusUpdate(name="coder", status=""))


async def test_a_read_reply_stays_within_its_byte_budget(bundle):
    """Large messages go out a few per read so the reply fits a frame; the rest wait,
    undelivered, for the next read."""
    big = "x" * (200 << 10)
    sent = [(await send(bundle, content=big + str(i))).message_id for i in range(3)]
    first = await read(bundle, limit=10, frame=1 << 20)  # budget: half the frame, encoded
    assert [m.message_id for m in first.messages] == sent[:2]
    second = await read(bundle, T0 + 1, limit=10, ack=sent[:2], frame=1 << 20)
    assert [m.message_id for m in second.messages] == sent[2:]
    assert second.messages[0].deliveries == 1 and second.acked == 2


async def test_the_read_budget_counts_encoded_bytes_not_characters(bundle):
    emoji = "😀" * 30_000  # 30,000 characters, 120,000 bytes of UTF-8
    sent = [(await send(bundle, content=emoji)).message_id for _ in range(10)]
    seen, got, reads = [], [], 0
    while len(seen) < 10:
        res = await read(bundle, T0 + reads, limit=100, ack=got, frame=1 << 20)
        assert len(_pack({"id": 1, "result": res})) <= (1 << 19) + 1024
        assert res.messages and all(m.deliveries == 1 for m in res.messages)
        got = [m.message_id for m in res.messages]
        seen += got
        reads += 1
    assert seen == sent and reads >= 3


async def test_a_stored_message_too_big_for_a_read_is_refused_and_nothing_changes(bundle):
    """Only a message stored before the send-side cap: the read says payload_too_large
    and neither its ack nor any delivery is written."""
    small = await send(bundle, content="small")
    await read(bundle)
    await send(bundle, T0 + 1, content="x" * (40 << 10), priority=0)
    with pytest.raises(errors.PayloadTooLarge, match="over half the 65536-byte frame cap"):
        await read(bundle, T0 + 2, ack=[small.message_id], frame=64 << 10)
    assert await bundle.store.ack_messages("b", [small.message_id], now=T0 + 3) == 1
    assert [m.deliveries for m in (await read(bundle, T0 + 4)).messages] == [1]


async def test_a_message_whose_encoding_would_not_fit_a_read_is_refused(bundle):
    h = hub(bundle, max_frame_bytes=64 << 10, message_max_bytes=64 << 10)
    with pytest.raises(errors.PayloadTooLarge, match="encoded"):
        await h.send_message(SendMessage(sender="a", recipient="b", content=[0.0] * 4000))
    assert await ids(bundle, FAR) == []


async def test_ack_only_counts_the_readers_own_deliveries(bundle):
    sent = await send(bundle)
    await read(bundle)
    st = bundle.store
    assert await st.ack_messages("c", [sent.message_id], now=T0 + 1) == 0
    assert await st.ack_messages("b", ["nope"], now=T0 + 1) == 0
    assert await st.ack_messages("b", [], now=T0 + 1) == 0
    assert await st.ack_messages("b", [sent.message_id, sent.message_id], now=T0 + 1) == 1
    h = hub(bundle)
    assert (await h.ack_messages(AckMessages(reader="b", message_ids=[sent.message_id]))
            ).acked == 0
    with pytest.raises(errors.BadRequest, match="at most 1000 message ids"):
        await h.ack_messages(AckMessages(reader="b", message_ids=["x"] * 1001))


async def test_agents_are_listed_in_pages_by_name_in_code_point_order(bundle):
    h = hub(bundle)
    names = ["agent-3", "Zed", "agent-1", "éclair", "Ärger", "agent-2", "a"]
    for name in names:
        await h.update_agent_status(AgentStatusUpdate(name=name, status="idle"))
    first = await h.get_agent_status(AgentQuery(limit=2))
    assert [a.name for a in first.agents] == ["Zed", "a"] and first.next_after == "a"
    rest = await h.get_agent_status(AgentQuery(limit=100, after=first.next_after))
    assert [a.name for a in rest.agents] == ["agent-1", "agent-2", "agent-3", "Ärger",
                                             "éclair"]
    assert rest.next_after is None
    assert [a.name for a in (await h.get_agent_status(AgentQuery())).agents] == sorted(names)
    for bad in (0, 1001):
        with pytest.raises(errors.BadRequest, match="limit must be 1..1000"):
            await h.get_agent_status(AgentQuery(limit=bad))
    with pytest.raises(errors.BadRequest):
        await h.get_agent_status(AgentQuery(after="bad\nname"))


async def test_agent_metadata_is_capped_so_a_page_fits_a_frame(bundle):
    h = hub(bundle, max_frame_bytes=256 << 10)  # a page may take half: 128 KiB
    with pytest.raises(errors.PayloadTooLarge, match="metadata is"):
        await h.update_agent_status(AgentStatusUpdate(name="big", status="idle",
                                                      metadata={"blob": "x" * (16 << 10)}))
    assert await bundle.store.agents(None, None, 1000, 300.0) == []
    for i in range(30):
        await h.update_agent_status(AgentStatusUpdate(name=f"a{i:02d}", status="idle",
                                                      metadata={"blob": "😀" * 3500}))
    seen, after, pages = [], None, 0
    while True:
        page = await h.get_agent_status(AgentQuery(limit=1000, after=after))
        assert len(_pack(page)) <= (256 << 10) // 2 + 1024
        seen += [a.name for a in page.agents]
        pages += 1
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == [f"a{i:02d}" for i in range(30)] and pages >= 4


async def test_agents_not_heard_from_for_the_retention_are_forgotten(bundle):
    h, st = hub(bundle, message_retention_s=1000), bundle.store
    await st.update_agent("gone", "idle", None, now=T0)
    await send(bundle, sender="x", recipient="gone", content="kept")
    await st.update_agent("active", "idle", None, now=T0 + 600)
    assert await h.purge_agents(now=T0 + 1000) == 0  # heard from exactly 1000 s ago: kept
    assert await h.purge_agents(now=T0 + 1001) == 1
    assert [a.name for a in await st.agents(None, None, 100, 300.0, now=T0 + 1001)] == \
        ["active"]
    assert len((await read(bundle, T0 + 1001, reader="gone")).messages) == 1


async def test_unread_counts_what_a_read_would_still_hand_over(bundle):
    st = bundle.store
    await st.update_agent("me", "idle", None, now=T0)
    await broadcast(bundle, sender="me", content="mine")
    acked = await broadcast(bundle, content="1")
    await broadcast(bundle, content="2")
    await broadcast(bundle, ttl_s=5, content="3")
    await send(bundle, sender="lead", recipient="me", content="d")
    await send(bundle, sender="lead", recipient="you", content="d")

    async def unread(now: float) -> int:
        return (await st.agents("me", None, 1, 300.0, now=now))[0].unread

    assert await unread(T0) == 4
    got = await read(bundle, T0, reader="me", limit=1)
    assert got.messages[0].message_id == acked.message_id
    assert await unread(T0) == 4  # delivered, held, not acked: still unread
    await read(bundle, T0, reader="me", limit=1, ack=[acked.message_id])
    assert await unread(T0) == 3
    assert await unread(T0 + 5) == 2  # the TTL'd broadcast expired


async def test_concurrent_reads_of_one_reader_hand_out_each_message_once(bundle):
    """Eight reads of one reader at once (eight connections on PostgreSQL): every message
    goes to exactly one of them; acks racing re-reads past the timeout lose nothing."""
    sent = {(await send(bundle, content=i)).message_id for i in range(40)}
    for b in ("x", "y"):
        await broadcast(bundle, content=b, message_id=f"bc-{b}")
    got = await asyncio.gather(*(read(bundle, T0 + 1, limit=6) for _ in range(8)))
    handed = [m.message_id for r in got for m in r.messages]
    assert sorted(handed) == sorted(sent | {"bc-x", "bc-y"})
    # past the timeout, acks and re-reads at once: whatever was acked is never handed again
    t = T0 + 1 + VIS
    halves = [handed[i::2] for i in range(2)]
    res = await asyncio.gather(bundle.store.ack_messages("b", halves[0], now=t),
                               read(bundle, t, limit=100, ack=halves[1]))
    assert (res[0], res[1].acked) == (len(halves[0]), len(halves[1]))
    assert {m.message_id for m in res[1].messages} <= set(halves[0])  # if read first
    assert await ids(bundle, FAR) == []  # no ack undone by a delivery
