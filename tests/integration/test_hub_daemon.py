"""The message hub against real coordd processes: two agents exchange messages while coordd
is SIGKILLed and later SIGTERMed and restarted; nothing is lost, nothing is seen twice."""

from __future__ import annotations

import asyncio
import sqlite3
import time

from coordd import errors
from coordd.client import CallTimeout, Client, Disconnected, SyncClient

FAST = """
reaper_interval_s = 0.2
prune_interval_s = 0.5
"""
N_EACH = 30
VISIBILITY_S = 10.0  # a delivery whose reply a crash ate comes back after this (rare)
RETRYABLE = (Disconnected, CallTimeout, errors.Overloaded)


class Agent:
    """A well-behaved agent: sends with its own message ids (a resend after a lost reply is
    stored once), remembers what it has handled, acks it on its next read, and never
    treats a message it has already handled as new."""

    def __init__(self, sock: str, me: str, peer: str) -> None:
        self.client = Client(sock, timeout=5)
        self.me, self.peer = me, peer
        self.sent = 0
        self.seen: list[str] = []  # message ids handed to this agent, in order
        self.redelivered: list[str] = []  # deliveries > 1 (a reply lost in a crash)
        self.to_ack: list[str] = []
        self.retries = 0  # calls that failed because coordd was down

    async def step(self) -> None:
        if self.sent < N_EACH:
            await self.client.send_message(self.me, self.peer, {"n": self.sent},
                                           message_id=f"{self.me}-{self.sent}")
            self.sent += 1
        got = await self.client.read_messages(self.me, ack=self.to_ack, limit=5,
                                              visibility_s=VISIBILITY_S)
        self.to_ack = []
        for m in got.messages:
            if m.deliveries > 1:
                self.redelivered.append(m.message_id)
            self.seen.append(m.message_id)
            self.to_ack.append(m.message_id)

    async def run(self, expected: int, stop_after: float) -> None:
        deadline = time.monotonic() + stop_after
        while (len(self.seen) < expected or self.sent < N_EACH or self.to_ack) \
                and time.monotonic() < deadline:
            try:
                if len(self.seen) >= expected and self.sent >= N_EACH:
                    await self.client.ack_messages(self.me, self.to_ack)
                    self.to_ack = []
                else:
                    await self.step()
            except RETRYABLE:
                self.retries += 1
                await self.client.close()  # coordd is restarting: reconnect on the next call
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.01)
        await self.client.close()


async def _wait(cond, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_two_agents_exchange_messages_across_coordd_kill_and_restart(daemon_factory):
    d = daemon_factory(FAST)
    d.start()
    async with Client(d.socket, timeout=5) as lead:
        news = await lead.broadcast("lead", "freeze merges", priority=0)
    a, b = Agent(d.socket, "alice", "bob"), Agent(d.socket, "bob", "alice")
    tasks = [asyncio.create_task(x.run(N_EACH + 1, 40.0)) for x in (a, b)]
    await _wait(lambda: len(a.seen) + len(b.seen) >= N_EACH * 2 // 3)
    d.kill()  # SIGKILL mid-exchange: no drain, no goodbye
    await asyncio.sleep(0.3)
    d.start()
    await _wait(lambda: len(a.seen) + len(b.seen) >= N_EACH * 4 // 3)
    assert d.stop() == 0  # SIGTERM: a clean stop, then a restart
    d.start()
    await asyncio.wait_for(asyncio.gather(*tasks), 45)

    for me, other in ((a, "bob"), (b, "alice")):
        expected = {f"{other}-{i}" for i in range(N_EACH)} | {news.message_id}
        assert set(me.seen) == expected, d.log()  # nothing lost
        assert len(me.seen) == len(expected)  # nothing handed to the agent twice
        # a redelivery (deliveries > 1) only follows a read whose reply the crash ate:
        # the agent saw those messages once, after coordd came back
        assert len(set(me.redelivered)) == len(me.redelivered)
    assert a.retries + b.retries > 0  # the restarts did hit the exchange
    conn = sqlite3.connect(d.db)
    try:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 2 * N_EACH + 1
        assert conn.execute("SELECT count(*) FROM messages WHERE recipient IS NOT NULL "
                            "AND status != 'processed'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*), sum(processed_at IS NOT NULL) FROM message_reads "
                            "WHERE message_id = ?", (news.message_id,)).fetchone() == (2, 2)
    finally:
        conn.close()


async def test_expired_message_never_delivered_and_purged_by_the_running_daemon(
        daemon_factory):
    d = daemon_factory(FAST)
    d.start()
    async with Client(d.socket, timeout=5) as c:
        short = await c.send_message("a", "b", "only for a moment", ttl_s=0.3)
        await c.broadcast("a", "also brief", ttl_s=0.3)
        keep = await c.send_message("a", "b", "stays")
        await asyncio.sleep(0.4)
        got = await c.read_messages("b")
        assert [m.message_id for m in got.messages] == [keep.message_id]
        assert (await c.read_messages("c")).messages == []

        def stored() -> int:
            conn = sqlite3.connect(d.db)
            try:
                return conn.execute("SELECT count(*) FROM messages WHERE message_id = ?",
                                    (short.message_id,)).fetchone()[0]
            finally:
                conn.close()
        await _wait(lambda: stored() == 0, 10)  # the prune round purged it


def test_coordctl_msg_send_read_broadcast_and_agents(daemon):
    from tests.integration.test_coordctl import ctl, ok, ok_json, refused
    sock = daemon.socket
    mid = ok(ctl(sock, "msg", "send", "--from", "lead", "--to", "coder", "review PR 7",
                 "--priority", "1", "--id", "lead-1")).strip()
    assert mid == "lead-1"
    ok(ctl(sock, "msg", "send", "--from", "lead", "--to", "coder", '{"pr": 8}',
           "--content-json", "--metadata", '{"thread": "t1"}'))
    ok(ctl(sock, "msg", "broadcast", "--from", "lead", "freeze merges", "--ttl", "600"))
    kept = ok_json(ctl(sock, "--json", "msg", "read", "--as", "coder", "--keep",
                       "--visibility", "0.2"))
    assert [m["content"] for m in kept["messages"]] == ["review PR 7", {"pr": 8}, "freeze merges"]
    assert kept["acked"] == 0 and kept["visible_until"] is not None
    time.sleep(0.3)  # --keep: back after the visibility timeout
    table = ok(ctl(sock, "msg", "read", "--as", "coder"))
    assert "review PR 7" in table and "(all)" in table and "3 acked" in table
    assert "no messages for coder" in ok(ctl(sock, "msg", "read", "--as", "coder"))
    assert ok_json(ctl(sock, "--json", "msg", "read", "--as", "lead"))["messages"] == []
    refused(ctl(sock, "msg", "send", "--to", "x", "--priority", "9", "hi"), 1, "bad_request")
    refused(ctl(sock, "msg", "read", "--limit", "0"), 1, "bad_request")
    refused(ctl(sock, "msg", "send", "hi"), 2, "usage")

    with SyncClient(sock) as c:
        c.update_agent_status("coder", "busy", {"task": "PR 7"})
    rows = ok_json(ctl(sock, "--json", "agents"))["agents"]
    assert [(a["name"], a["status"], a["live"], a["unread"]) for a in rows] == \
        [("coder", "busy", True, 0)]
    assert "PR 7" in ok(ctl(sock, "agents", "coder"))
    refused(ctl(sock, "agents", "nobody"), 1, "not_found")
