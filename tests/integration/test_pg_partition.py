"""Fail-over drill with the active coordd cut off from PostgreSQL while a worker holds
leases: the active must stop serving (its lock session lost: exit 3) within the
documented detection time, the standby takes over, the worker fails over, every job
succeeds exactly once, and no lease is expired by the fail-over alone.

The cut: the active reaches PostgreSQL through a TCP proxy (tests/integration/pgproxy.py)
that is frozen: it stops forwarding and keeps every socket open, so neither side hears a
FIN or a reset, as across a silent partition. A stand-in for a network partition that
needs no privileges; where we are root and `ip netns` and `nft` work, the same drill also
runs with the active in a network namespace whose veth link drops every packet (nftables).
The standby reaches PostgreSQL directly.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from coordd.client import Client
from tests.integration.pgproxy import FreezableProxy
from tests.integration.test_pg_daemon import Coordd, Rig, _all_done, _once, pg_db  # noqa: F401
from tests.integration.workerbench import stop_workers, until

SESSION_TIMEOUT_S = 1.5
# the active's probe (a third of the session timeout) unanswered for a third: it exits;
# the server ends the silent lock session at the session timeout: the standby leads
DETECT_MAX_S = SESSION_TIMEOUT_S  # documented: "within store_session_timeout_s"
TAKEOVER_MAX_S = SESSION_TIMEOUT_S + 2.0
_ME = os.getpid() % 250  # names and a subnet of this run's own (parallel runs, other tests)
NS, VETH_HOST, VETH_NS = f"cdpgpart{_ME}", f"cdpg{_ME}h", f"cdpg{_ME}n"
HOST_IP, NS_IP = f"10.203.{_ME}.1", f"10.203.{_ME}.2"


def _unix_socket(dsn: str) -> tuple[str, str]:
    """(PostgreSQL's Unix socket file, database name) of a throwaway-cluster DSN."""
    url = urllib.parse.urlsplit(dsn)
    q = urllib.parse.parse_qs(url.query)
    return f"{q['host'][0]}/.s.PGSQL.{q['port'][0]}", url.path.lstrip("/")


class Netns:
    """A network namespace joined to this one by a veth pair; `cut()` drops every packet
    between them (nftables, inside the namespace); `ip netns exec` runs a program there."""

    def __init__(self) -> None:
        self.made = False

    @staticmethod
    def why_not() -> str | None:
        if os.geteuid() != 0:
            return "needs root (ip netns, nft)"
        for tool in ("ip", "nft"):
            if shutil.which(tool) is None:
                return f"`{tool}` not installed"
        return None

    def _ip(self, *argv: str) -> None:
        subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=10)

    def make(self) -> None:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True, timeout=10)
        self._ip("netns", "add", NS)
        self.made = True
        self._ip("link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_NS)
        self._ip("link", "set", VETH_NS, "netns", NS)
        self._ip("addr", "add", f"{HOST_IP}/24", "dev", VETH_HOST)
        self._ip("link", "set", VETH_HOST, "up")
        self._ip("-n", NS, "addr", "add", f"{NS_IP}/24", "dev", VETH_NS)
        self._ip("-n", NS, "link", "set", VETH_NS, "up")
        self._ip("-n", NS, "link", "set", "lo", "up")

    def argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", NS, *argv]

    def cut(self) -> None:
        for rule in ("add table inet cdpgpart",  # the namespace's own ruleset
                     "add chain inet cdpgpart in { type filter hook input priority 0 ; }",
                     "add chain inet cdpgpart out { type filter hook output priority 0 ; }",
                     f"add rule inet cdpgpart in ip saddr {HOST_IP} drop",
                     f"add rule inet cdpgpart out ip daddr {HOST_IP} drop"):
            subprocess.run(["ip", "netns", "exec", NS, "nft", *rule.split()], check=True,
                           capture_output=True, timeout=10)

    def remove(self) -> None:
        if self.made:
            subprocess.run(["ip", "netns", "del", NS], capture_output=True, timeout=10)
            subprocess.run(["ip", "link", "del", VETH_HOST], capture_output=True, timeout=10)


@pytest.fixture
def drill(pg_db: str, tmp_path: Path) -> Any:  # noqa: F811 - pg_db is the fixture
    r = Rig(tmp_path, pg_db, [], [])
    made: list[Any] = []
    yield r, made
    stop_workers(r.workers)
    for thing in made:  # the proxy (frozen), the namespace: the cut heals here
        thing.close() if isinstance(thing, FreezableProxy) else thing.remove()
    for d in r.coordds:
        d.stop()


async def _partition_drill(rig: Rig, made: list[Any], how: str) -> dict[str, float]:
    upstream, db = _unix_socket(rig.dsn)
    netns = None
    if how == "netns":
        netns = Netns()
        made.append(netns)
        try:
            netns.make()
            subprocess.run(netns.argv(["nft", "list", "tables"]), check=True,
                           capture_output=True, timeout=10)
        except (subprocess.CalledProcessError, OSError) as exc:
            pytest.skip(f"cannot make a network namespace here: "
                        f"{getattr(exc, 'stderr', b'') or exc}")
    proxy = FreezableProxy(upstream, HOST_IP if netns else "127.0.0.1").start()
    made.insert(0, proxy)
    a = rig.coordd("a", session_timeout_s=SESSION_TIMEOUT_S,
                   dsn=f"postgresql://coord@{proxy.host}:{proxy.port}/{db}",
                   wrap=tuple(netns.argv([])) if netns else ())
    await a.wait_serving()
    b = rig.coordd("b", session_timeout_s=SESSION_TIMEOUT_S)
    await b.wait_log("standby: waiting for the active coordd")
    async with Client(a.socket, timeout=10) as c:
        ids = [(await c.enqueue(kind="m", required_role="cpu", priority=1,
                                payload={"echo": i, "sleep": 1.2})).job_id for i in range(3)]
    w = rig.worker("w1", [a.socket, b.socket], slots=2, lease_s=8, claim_wait_s=2)

    async def holding() -> bool:
        async with Client(a.socket, timeout=5) as c:
            return (await c.status()).active_leases == 2
    await until(holding, 30, "the worker holds two leases")
    cut = time.monotonic()
    if netns is not None:
        netns.cut()
    else:
        proxy.freeze()
    assert await asyncio.to_thread(a.proc.wait, 15) == 3, a.log()
    detect_s = time.monotonic() - cut
    takeover_s = await b.wait_serving() - cut
    assert "leadership lost" in a.log() and not os.path.exists(a.socket)
    async with Client(b.socket, timeout=10) as c:
        jobs = await _all_done(c, ids, 60)
        assert all(_once(j) for j in jobs), (
            [(j.job_id, j.status, [(e.to_status, e.reason) for e in j.events]) for j in jobs],
            w.log())
        assert (await c.status()).jobs["succeeded"] == 3
    assert "coordd unreachable" in w.log() and "coordd reachable again" in w.log()
    assert "lease_lost" not in w.log() and "lease lost" not in w.log(), w.log()
    assert "lease expired" not in b.log()
    print(f"\npartition drill ({how}, store_session_timeout_s = {SESSION_TIMEOUT_S}): the "
          f"active exited 3 after {detect_s * 1000:.0f} ms, the standby served after "
          f"{takeover_s * 1000:.0f} ms")
    assert detect_s < DETECT_MAX_S, (detect_s, a.log())
    assert takeover_s < TAKEOVER_MAX_S, (takeover_s, b.log())
    return {"detect_s": detect_s, "takeover_s": takeover_s}


async def test_an_active_cut_off_from_postgres_exits_and_the_standby_takes_over(drill):
    """The root-less stand-in: the proxy between the active and PostgreSQL freezes."""
    await _partition_drill(*drill, "frozen-proxy")


@pytest.mark.skipif(Netns.why_not() is not None, reason=f"netns drill: {Netns.why_not()}")
async def test_an_active_partitioned_in_a_network_namespace_fails_over(drill):
    """A real partition: the active in its own network namespace, every packet on its
    link to PostgreSQL's side dropped by nftables (no FIN, no reset)."""
    await _partition_drill(*drill, "netns")
