"""Partition drills between network namespaces (issue 18; shared/FLEET.md A4, A5).

coordd runs in one namespace, worker wa in another, over TCP + mutual TLS on a veth pair.
With wa holding a lease, the link is cut (an nft silent drop, or the link set down): wa
stops its model before its lease ends on its own monotonic clock, coordd reaps, worker wb
(on the Unix socket) takes the job with a higher token and finishes it; after the heal,
wa's stale renew and complete are fenced, and the job has succeeded exactly once. Also
with wa's wall clock 5 minutes off (libfaketime): wa times its lease on durations only.

Real time by necessity (kernel, TCP); slow-marked, root with `ip netns` only; each run has
its own namespace names and addresses and removes them at exit. No netem (absent from this
kernel): nft and `ip link set down` only.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coordd.client import Client
from tests.integration.fleet_certs import make_fleet
from tests.integration.workerbench import COOL, until, worker_toml

ROUNDS = int(os.environ.get("COORDD_PARTITION_ROUNDS", "20"))
LEASE_S = 3.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                       reason="network namespaces need root and iproute2"),
]

MODEL = textwrap.dedent("""
    import json, os, sys, time
    me = os.environ["COORD_WORKER_ID"]
    open(os.path.join(os.environ["PIDDIR"], os.environ["COORD_JOB_ID"] + "." + me), "w").write(str(os.getpid()))
    time.sleep(60 if me == "wa" else 0)
    json.dump({"by": me}, open(os.environ["COORD_RESULT"], "w"))
""")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=check)


class Lab:
    """Two namespaces joined by a veth pair; partitions by nft or by link state."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.srv, self.wrk = f"cdps-{tag}", f"cdpw-{tag}"
        self.vs, self.vw = f"cvs{tag}", f"cvw{tag}"
        net = f"10.{random.randint(100, 250)}.{random.randint(1, 250)}"
        self.s_ip, self.w_ip = f"{net}.1", f"{net}.2"

    def up(self) -> None:
        sh("ip", "netns", "add", self.srv)
        sh("ip", "netns", "add", self.wrk)
        sh("ip", "link", "add", self.vs, "type", "veth", "peer", "name", self.vw)
        sh("ip", "link", "set", self.vs, "netns", self.srv)
        sh("ip", "link", "set", self.vw, "netns", self.wrk)
        sh("ip", "-n", self.srv, "addr", "add", f"{self.s_ip}/24", "dev", self.vs)
        sh("ip", "-n", self.wrk, "addr", "add", f"{self.w_ip}/24", "dev", self.vw)
        for ns, dev in ((self.srv, self.vs), (self.wrk, self.vw)):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", dev, "up")

    def cut(self, mode: str) -> None:
        if mode == "link":
            sh("ip", "-n", self.srv, "link", "set", self.vs, "down")
            return
        nft = ["ip", "netns", "exec", self.srv, "nft"]
        sh(*nft, "add", "table", "inet", "cdpart")
        for chain, hook, match in (("in", "input", "saddr"), ("out", "output", "daddr")):
            sh(*nft, f"add chain inet cdpart {chain} {{ type filter hook {hook} priority 0 ; "
                     "policy accept ; }")
            sh(*nft, "add", "rule", "inet", "cdpart", chain, "ip", match, self.w_ip, "drop")

    def heal(self, mode: str) -> None:
        if mode == "link":
            sh("ip", "-n", self.srv, "link", "set", self.vs, "up")
        else:
            sh("ip", "netns", "exec", self.srv, "nft", "delete", "table", "inet", "cdpart")

    def close(self) -> None:
        for ns in (self.srv, self.wrk):
            sh("ip", "netns", "del", ns, check=False)


@pytest.fixture
def lab():
    if sh("ip", "netns", "list", check=False).returncode != 0:
        pytest.skip("ip netns does not work here")
    lab = Lab()
    try:
        lab.up()
    except subprocess.CalledProcessError as exc:
        lab.close()
        pytest.skip(f"cannot build the namespaces: {exc.stderr.strip()}")
    yield lab
    lab.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (the worker has not reaped it yet) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def _drill(lab, daemon_factory, tmp_path, mode: str, rounds: int,
                 skew: bool = False) -> None:
    fleet = make_fleet(tmp_path, time.time())
    cfg = fleet.config().replace("127.0.0.1", lab.s_ip)
    d = daemon_factory("reaper_interval_s = 0.2\nheartbeat_stale_s = 5\nbackoff_base_s = 0.1\n"
                       "backoff_cap_s = 0.2\nmax_attempts_default = 100\n" + cfg)
    argv = ["ip", "netns", "exec", lab.srv, sys.executable, "-m", "coordd", "--db", d.db,
            "--socket", d.socket, "--config", d.config]
    with open(d.log_path, "ab") as log:
        d.proc = subprocess.Popen(argv, stdout=log, stderr=log)
    d.wait_ready()
    piddir = tmp_path / "pids"
    piddir.mkdir()
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "cool.json").write_text(json.dumps(COOL))

    def worker(wid: str, ns_argv: list[str], connect: list[str]) -> subprocess.Popen:
        cfgp = tmp_path / f"{wid}.toml"
        cfgp.write_text(worker_toml(tmp_path / f"host-{wid}" / "work", {"m": {
            "argv": [sys.executable, str(tmp_path / "model.py")],
            "env": {"PIDDIR": str(piddir)}}}, lease_s=LEASE_S, grace_s=0.3))
        log = open(tmp_path / f"{wid}.log", "ab")
        p = subprocess.Popen([*ns_argv, sys.executable, "-m", "worker", "--worker-id", wid,
                              "--roles", "cpu", *connect, "--config", str(cfgp),
                              "--readings-override", str(tmp_path / "cool.json")],
                             stdout=log, stderr=log, start_new_session=True)
        log.close()
        return p

    wa_files = fleet.files("worker-wa")
    ns_wa = ["ip", "netns", "exec", lab.wrk] + (["faketime", "-f", "-300s"] if skew else [])
    wa = worker("wa", ns_wa, ["--connect", f"tls://{lab.s_ip}:{fleet.port}", "--cert",
                              wa_files.cert, "--key", wa_files.key, "--ca", wa_files.ca])
    wb = None
    doubles = 0
    try:
        async with Client(d.socket, timeout=10) as c:
            for n in range(rounds):
                job = (await c.enqueue(kind="m", required_role="cpu", priority=1,
                                       payload={})).job_id
                view = await until(lambda: _running_on(c, job, "wa"), 30, "wa runs the job",
                                   every=0.02)
                token1 = view.lease.token
                pid = int(await until(lambda: _read(piddir / f"{job}.wa"), 10, "model pid",
                                      every=0.02))
                await asyncio.sleep(random.uniform(0.2, 1.2))  # anywhere in a renew period
                lab.cut(mode)
                try:
                    expiry = (await c.get_job(job)).lease.expires_at
                    # wa stops its model before coordd's expiry (its own deadline is earlier)
                    gone_at = await until(lambda: _gone(pid), LEASE_S + 5, "model stopped",
                                          every=0.02)
                    assert gone_at < expiry, (n, gone_at - expiry)
                    print(f"{mode} round {n}: model stopped {expiry - gone_at:.3f}s before "
                          "coordd's expiry")
                    if wb is None:
                        wb = worker("wb", [], ["--socket", d.socket])
                    done = await until(lambda: _ended(c, job), 30, "job done by wb",
                                       every=0.02)
                    assert done.status == "succeeded" and done.result == {"by": "wb"}
                    assert done.attempts >= 2
                finally:
                    lab.heal(mode)
                # the heal: wa's stale renew and complete (token 1) are fenced
                await _stale_calls_fenced(lab, fleet, wa_files, job, token1)
                final = await c.get_job(job)
                wins = [e for e in final.events if e.to_status == "succeeded"]
                doubles += len(wins) != 1
                assert final.status == "succeeded" and final.result == {"by": "wb"}
                if wb is not None:  # wa claims the next job alone
                    wb.send_signal(signal.SIGTERM)
                    wb.wait(15)
                    wb = None
        assert doubles == 0
    finally:
        for p in (wa, wb):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
            d.proc.wait(15)


STALE = textwrap.dedent("""
    import asyncio, sys
    from coordd import errors
    from coordd.client import Client
    from coordd.transport import Connector, TlsFiles
    url, cert, key, ca, job, token = sys.argv[1:]
    async def main():
        async with Client(connector=Connector(url, TlsFiles(cert, key, ca)), timeout=5) as c:
            for call in (c.renew(job, "wa", int(token)), c.complete(job, "wa", int(token), {"by": "wa"})):
                try:
                    await call
                    print("accepted")
                except errors.CoordError as exc:
                    print(exc.code)
    asyncio.run(main())
""")


async def _stale_calls_fenced(lab, fleet, files, job: str, token: int) -> None:
    for _ in range(20):  # a link just set up may refuse connects for a moment
        out = subprocess.run(["ip", "netns", "exec", lab.wrk, sys.executable, "-c", STALE,
                              f"tls://{lab.s_ip}:{fleet.port}", files.cert, files.key,
                              files.ca, job, str(token)], capture_output=True, text=True,
                             timeout=30)
        if out.stdout or "cannot connect" not in out.stderr:
            break
        await asyncio.sleep(0.5)
    codes = out.stdout.split()
    assert len(codes) == 2 and "accepted" not in codes, (out.stdout, out.stderr)
    assert set(codes) <= {"lease_lost", "already_completed", "lease_expired"}, codes


async def _running_on(c, job, wid):
    v = await c.get_job(job)
    return v if v.status == "running" and v.lease and v.lease.worker_id == wid else None


async def _read(path: Path):
    return path.read_text() if path.exists() and path.read_text() else None


async def _gone(pid: int):
    return None if pid_alive(pid) else time.time()


async def _ended(c, job):
    v = await c.get_job(job)
    return v if v.status in ("succeeded", "failed") else None


@pytest.mark.parametrize("mode", ["nft", "link"])
async def test_partition_fences_the_stale_worker(lab, daemon_factory, tmp_path, mode):
    if mode == "nft" and shutil.which("nft") is None:
        pytest.skip("nft is not installed (apt-get install nftables)")
    await _drill(lab, daemon_factory, tmp_path, mode, ROUNDS)


async def test_partition_with_the_worker_clock_5_minutes_off(lab, daemon_factory, tmp_path):
    if shutil.which("faketime") is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    if shutil.which("nft") is None:
        pytest.skip("nft is not installed (apt-get install nftables)")
    await _drill(lab, daemon_factory, tmp_path, "nft", max(3, ROUNDS // 4), skew=True)
