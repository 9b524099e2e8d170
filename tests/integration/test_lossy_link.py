"""A lossy link (issue 18; FLEET.md A4 "Flaky links"): a user-space relay between a client
and coordd that delays every frame and loses chosen replies. A lost claim reply leaves no
orphan lease (the resent `claim_id` is replayed); a lost `complete` reply, resent, is
recognised (`already_completed`: the stored result stands). coordd's TCP listener in its
loopback plaintext test mode, so the relay can read the frames."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest

from coordd import errors
from coordd.client import CallTimeout, Client
from coordd.net.frames import HEADER
from tests.integration.fleet_certs import free_port

COOL = {"memory_used_pct": 10.0, "temperature_c": 40.0, "on_battery": False, "user_idle_s": 9999.0}


class Relay:
    """Copies frames both ways after `delay_s`; drops the first reply to each method in
    `lose` (its request still reaches coordd)."""

    def __init__(self, upstream: int, lose: set[str], delay_s: float = 0.05) -> None:
        self.upstream, self.lose, self.delay_s = upstream, set(lose), delay_s
        self.lost: list[str] = []
        self._methods: dict[int, str] = {}
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _conn(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.upstream)
        self._writers += [cw, sw]
        await asyncio.gather(self._pipe(cr, sw, up=True), self._pipe(sr, cw, up=False),
                             return_exceptions=True)

    async def close(self) -> None:
        self.server.close()
        for w in self._writers:
            w.close()
        await self.server.wait_closed()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, up: bool) -> None:
        try:
            while True:
                head = await r.readexactly(HEADER.size)
                body = await r.readexactly(HEADER.unpack(head)[0])
                msg = msgspec.msgpack.decode(body)
                await asyncio.sleep(self.delay_s)
                if up:
                    self._methods[msg["id"]] = msg["method"]
                else:
                    method = self._methods.pop(msg.get("id"), "")
                    if method in self.lose:
                        self.lose.discard(method)
                        self.lost.append(method)
                        continue
                w.write(head + body)
                await w.drain()
        finally:
            w.close()


@pytest.fixture
def plain_daemon(daemon_factory):
    port = free_port()
    d = daemon_factory(f'listen_tcp = "127.0.0.1:{port}"\ntcp_insecure_plaintext = true\n')
    d.start()
    return d, port


async def test_lost_claim_and_complete_replies_leave_no_orphan_and_no_double(plain_daemon):
    d, port = plain_daemon
    relay = Relay(port, {"claim", "complete"})
    rport = await relay.start()
    async with Client(d.socket) as admin:
        job = (await admin.enqueue(kind="k", required_role="cpu", priority=1, payload={})).job_id
        async with Client(f"tcp://127.0.0.1:{rport}", timeout=1.0) as w:
            await w.heartbeat("wa", ["cpu"], COOL)
            claim_id = uuid.uuid4().hex
            with pytest.raises(CallTimeout):  # the reply is lost; the lease was granted
                await w.claim("wa", lease_s=30, claim_id=claim_id)
            again = await w.claim("wa", lease_s=30, claim_id=claim_id)  # same connection
            assert again.job is not None and again.job.job_id == job
            token = again.lease.token
            assert (await w.claim("wa", lease_s=30, claim_id=uuid.uuid4().hex)).job is None
            with pytest.raises(CallTimeout):  # stored, but the reply is lost
                await w.complete(job, "wa", token, {"ok": 1})
            with pytest.raises(errors.AlreadyCompleted):  # the resend: it is ours, stored
                await w.complete(job, "wa", token, {"ok": 1})
        await relay.close()
        view = await admin.get_job(job)
        status = await admin.status()
    assert relay.lost == ["claim", "complete"]
    assert view.status == "succeeded" and view.result == {"ok": 1} and view.attempts == 1
    assert status.active_leases == 0  # no orphan lease
    assert [e.to_status for e in view.events].count("running") == 1
    assert "PLAINTEXT" in d.log()
