"""worker.logs.LogShipper against a stand-in client: chunks in order from the acknowledged
position, a lost reply resent exactly (even after the file grew), a backlog larger than
coordd keeps skipped to its tail, and a lost lease ends the shipping."""

from __future__ import annotations

import logging

from coordd import errors
from coordd.client import Disconnected
from coordd.wire.logs import LOG_CHUNK_MAX_BYTES, LOG_KEEP_BYTES
from worker.logs import LogShipper


class FakeClient:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bytes]] = []
        self.fail_next: list[Exception] = []

    async def log_append(self, job_id, worker_id, token, stream, pos, data):
        if self.fail_next:
            raise self.fail_next.pop(0)
        self.sent.append((stream, pos, data))


def shipper(tmp_path, client):
    paths = {s: str(tmp_path / f"{s}.log") for s in ("stdout", "stderr")}
    for p in paths.values():
        open(p, "wb").close()
    return LogShipper(client, "w1", "j1", 3, paths), paths


async def test_chunks_go_in_order_and_a_lost_reply_is_resent_as_it_was(tmp_path, caplog):
    c = FakeClient()
    s, paths = shipper(tmp_path, c)
    with open(paths["stdout"], "ab") as f:
        f.write(b"one\n")
    c.fail_next = [Disconnected("gone"), Disconnected("gone")]
    with caplog.at_level(logging.WARNING, logger="worker.logs"):
        await s.ship()
        with open(paths["stdout"], "ab") as f:
            f.write(b"two\n")
        await s.ship()  # still failing: the same chunk, not a bigger one
    assert [r.message for r in caplog.records].count(
        "output of job j1 not shipped (will retry): gone") == 1  # a change of state, once
    await s.ship()
    assert c.sent == [("stdout", 0, b"one\n"), ("stdout", 4, b"two\n")]
    with open(paths["stderr"], "ab") as f:
        f.write(b"e" * (LOG_CHUNK_MAX_BYTES + 10))
    await s.ship()
    assert [(st, pos, len(d)) for st, pos, d in c.sent[2:]] == [
        ("stderr", 0, LOG_CHUNK_MAX_BYTES), ("stderr", LOG_CHUNK_MAX_BYTES, 10)]


async def test_a_backlog_past_what_coordd_keeps_is_shipped_by_its_tail(tmp_path):
    c = FakeClient()
    s, paths = shipper(tmp_path, c)
    size = LOG_KEEP_BYTES * 3 + 5
    with open(paths["stdout"], "ab") as f:
        f.write(b"x" * size)
    await s.ship(max_chunks=2)
    assert [pos for _, pos, _ in c.sent] == [size - LOG_KEEP_BYTES,
                                             size - LOG_KEEP_BYTES + LOG_CHUNK_MAX_BYTES]
    await s.ship()
    assert sum(len(d) for _, _, d in c.sent) == LOG_KEEP_BYTES


async def test_a_lost_lease_stops_shipping(tmp_path):
    c = FakeClient()
    s, paths = shipper(tmp_path, c)
    with open(paths["stdout"], "ab") as f:
        f.write(b"late\n")
    c.fail_next = [errors.LeaseLost("lease 3 lost")]
    await s.ship()
    assert s.stopped
    await s.ship()
    assert c.sent == []
