"""coordd on the PostgreSQL store, as processes: real coordd processes on the session's
throwaway cluster (tests/conftest.py `pg_dsn`, a fresh database per test), real
coord-worker processes, SIGKILL for the fail-over drill (issue 20). Skipped, with the
reason, without asyncpg or the PostgreSQL binaries."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordd import errors
from coordd.client import Client
from tests.integration.conftest import pg_db  # noqa: F401 - the fixture, for the pg files
from tests.integration.workerbench import COOL, MODEL, stop_workers, until, worker_toml, WorkerProc

START_TIMEOUT_S = 20.0
DAEMON_CFG = """
reaper_interval_s = 0.3
heartbeat_stale_s = 5
backoff_base_s = 0.2
backoff_cap_s = 0.5
"""


@dataclass
class Coordd:
    """A coordd process on the PostgreSQL store."""

    dsn: str
    socket: str
    config: str
    log_path: Path
    proc: subprocess.Popen | None = None
    wrap: tuple[str, ...] = ()  # a command to run it under (`ip netns exec NS`)

    def start(self) -> Coordd:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.wrap, sys.executable, "-m", "coordd", "--store", self.dsn, "--socket",
             self.socket, "--config", self.config], stdout=log, stderr=log)
        log.close()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_log(self, text: str, timeout: float = START_TIMEOUT_S) -> None:
        async def seen() -> bool:
            assert self.proc.poll() is None, f"coordd exited {self.proc.returncode}: {self.log()}"
            return text in self.log()
        await until(seen, timeout, f"{text!r} in {self.log_path.name}")

    async def wait_serving(self, timeout: float = START_TIMEOUT_S) -> float:
        """Until it answers `status`; returns when (monotonic)."""
        async def answers() -> float | None:
            assert self.proc.poll() is None, f"coordd exited {self.proc.returncode}: {self.log()}"
            try:
                async with Client(self.socket, timeout=2) as c:
                    await c.status()
            except errors.CoordError:
                return None
            return time.monotonic()
        return await until(answers, timeout, f"{self.log_path.name} serving")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class Rig:
    """Coordds on one store, workers, and a model steered by its payload."""

    tmp: Path
    dsn: str
    coordds: list[Coordd]
    workers: list[WorkerProc]
    config_extra: str = ""  # more coordd.toml lines for every coordd of the rig

    def coordd(self, name: str, socket: str | None = None,
               session_timeout_s: float = 5.0, dsn: str | None = None,
               wrap: tuple[str, ...] = ()) -> Coordd:
        cfg = self.tmp / f"{name}.toml"
        cfg.write_text(DAEMON_CFG + self.config_extra
                       + f"store_session_timeout_s = {session_timeout_s}\n")
        d = Coordd(dsn or self.dsn, socket or str(self.tmp / f"{name}.sock"), str(cfg),
                   self.tmp / f"{name}.log", wrap=wrap)
        self.coordds.append(d)
        return d.start()

    def worker(self, worker_id: str, sockets: list[str], **settings: Any) -> WorkerProc:
        model = self.tmp / "model.py"
        model.write_text(MODEL)
        override = self.tmp / "readings.json"
        override.write_text(__import__("json").dumps(COOL))
        work_dir = self.tmp / f"work-{worker_id}"
        cfg = self.tmp / f"{worker_id}.toml"
        cfg.write_text(worker_toml(work_dir, {"m": {"argv": [sys.executable, str(model)],
                                                    "slots": settings.pop("slots", 1)}},
                                   **settings))
        log_path = self.tmp / f"{worker_id}.log"
        argv = [sys.executable, "-m", "worker", "--worker-id", worker_id, "--roles", "cpu",
                "--config", str(cfg), "--readings-override", str(override)]
        for s in sockets:
            argv += ["--socket", s]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=log)
        w = WorkerProc(worker_id, proc, log_path, work_dir)
        self.workers.append(w)
        return w


@pytest.fixture
def rig(pg_db: str, tmp_path: Path) -> Any:
    r = Rig(tmp_path, pg_db, [], [])
    yield r
    stop_workers(r.workers)
    for d in r.coordds:
        d.stop()


async def _all_done(client: Client, ids: list[str], timeout: float) -> list[Any]:
    async def done() -> list[Any] | None:
        jobs = [await client.get_job(j) for j in ids]
        return jobs if all(j.status in ("succeeded", "failed", "cancelled") for j in jobs) \
            else None
    return await until(done, timeout, "every job ended")


def _once(job: Any) -> bool:
    """Succeeded at the first attempt, run once: one `running`, one `succeeded`, no other."""
    return job.status == "succeeded" and job.attempts == 1 and \
        [e.to_status for e in job.events] == ["waiting", "running", "succeeded"]


async def test_coordd_on_postgres_drains_with_a_real_worker(rig):
    a = rig.coordd("a")
    await a.wait_serving()
    async with Client(a.socket, timeout=10) as c:
        ids = [(await c.enqueue(kind="m", required_role="cpu", priority=1,
                                payload={"echo": i})).job_id for i in range(12)]
        w = rig.worker("w1", [a.socket], slots=3, claim_wait_s=5)
        jobs = await _all_done(c, ids, 60)
        assert all(_once(j) for j in jobs), [(j.job_id, j.status, j.events) for j in jobs]
        assert sorted(j.result["echo"] for j in jobs) == list(range(12)), w.log()
        st = await c.status()
        assert st.jobs["succeeded"] == 12 and st.active_leases == 0 and st.workers == 1
        # backup: refused with the tool to use; check and schedules are served
        with pytest.raises(errors.InvalidState, match="pg_dump"):
            await c.call("backup", {"dest": str(rig.tmp / "b.db")})
        assert (await c.call("check", {}))["quick_check"] == "ok"
        assert (await c.call("schedule_list", {}))["schedules"] == []
        # bad input: the SQLite path's checks and codes, nothing stored
        with pytest.raises(errors.BadRequest, match="priority must be 0..3"):
            await c.enqueue(kind="m", required_role="cpu", priority=7, payload={})
        with pytest.raises(errors.BadRequest, match="readings"):
            await c.heartbeat("w2", ["cpu"], {"memory_used_pct": "hot"})
        with pytest.raises(errors.BadRequest, match="wait_s"):
            await c.call("claim", {"worker_id": "w1", "wait_s": -1})
        with pytest.raises(errors.LeaseLost):
            await c.complete(jobs[0].job_id, "w1", 999, {"x": 1})
        with pytest.raises(errors.NotFound):
            await c.get_job("nope")
        one = jobs[0].job_id  # coordctl show PREFIX: its shortest prefix no other job has
        short = next(one[:n] for n in range(1, 17)
                     if not any(j.job_id.startswith(one[:n]) for j in jobs[1:]))
        assert (await c.get_job(short, prefix=True)).job_id == one
        if len(short) > 1:  # one character less: another job's too
            with pytest.raises(errors.BadRequest, match="ambiguous"):
                await c.get_job(short[:-1], prefix=True)
        assert (await c.get_job(jobs[0].job_id, prefix=True)).job_id == jobs[0].job_id
        assert (await c.status()).jobs["succeeded"] == 12
    assert "Traceback" not in a.log() and "internal error" not in a.log()


async def test_a_standby_waits_without_listening_and_takes_over_at_sigkill(rig):
    """The fast fail-over drill: jobs run on a worker that lists both coordds; the active
    one is SIGKILLed while the worker holds leases; the standby takes over, the worker
    reconnects and every job succeeds exactly once, no lease expired by the fail-over."""
    a = rig.coordd("a")
    await a.wait_serving()
    b = rig.coordd("b")
    await b.wait_log("standby: waiting for the active coordd")
    assert not os.path.exists(b.socket)  # no listener before it leads
    async with Client(a.socket, timeout=10) as c:
        ids = [(await c.enqueue(kind="m", required_role="cpu", priority=1,
                                payload={"echo": i, "sleep": 1.0})).job_id for i in range(3)]
    w = rig.worker("w1", [a.socket, b.socket], slots=2, lease_s=8, claim_wait_s=2)

    async def holding() -> bool:
        async with Client(a.socket, timeout=5) as c:
            return (await c.status()).active_leases == 2
    await until(holding, 20, "the worker holds two leases")
    killed = time.monotonic()
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(5)
    serving = await b.wait_serving()
    takeover_s = serving - killed
    print(f"\ntake-over (SIGKILL of the active -> standby serving): {takeover_s * 1000:.0f} ms")
    assert takeover_s < 5.0, b.log()
    assert "restart grace: 2 lease(s)" in b.log()
    async with Client(b.socket, timeout=10) as c:
        jobs = await _all_done(c, ids, 60)
        assert all(_once(j) for j in jobs), (
            [(j.job_id, j.status, [(e.to_status, e.reason) for e in j.events]) for j in jobs],
            w.log())
    # the worker's line for the fail-over, whether a call failed first or found its
    # connection gone and dialled again at once
    assert f"; connected to {b.socket}" in w.log(), w.log()
    assert "lease_lost" not in w.log() and "lease lost" not in w.log()


async def test_a_standby_on_the_actives_socket_is_refused_at_start_and_the_active_serves(
        rig):
    """One host, one --socket for both: the standby is refused at once, clearly (it
    would find the path taken at fail-over: a frozen active keeps the socket's lock), and
    never touches the active's live socket; `coordctl top` works there."""
    a = rig.coordd("a")
    await a.wait_serving()
    b = rig.coordd("b", socket=a.socket)
    assert await asyncio.to_thread(b.proc.wait, 20) == 1
    assert "is in use by a running coordd (the active one?): a standby on the same host " \
        "needs a --socket of its own" in b.log(), b.log()
    async with Client(a.socket, timeout=5) as c:
        assert (await c.status()).workers == 0
    top = subprocess.run([sys.executable, "-m", "coordctl", "--socket", a.socket, "top",
                          "--once"], capture_output=True, text=True, timeout=60)
    assert top.returncode == 0 and "Traceback" not in top.stderr, top.stderr  # served now


async def test_a_standby_stopped_while_waiting_says_so_and_exits_0(rig):
    a = rig.coordd("a")
    await a.wait_serving()
    b = rig.coordd("b")
    await b.wait_log("standby: waiting for the active coordd")
    b.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(b.proc.wait, 10) == 0
    assert "standby stopped (it never served)" in b.log(), b.log()
    assert not os.path.exists(b.socket)


async def test_a_standby_older_than_the_schema_refuses_to_take_over(rig):
    """Mixed versions at a fail-over: while a standby waits, a newer coordd migrates the
    database (here: its version row, as that migration would leave it) and the active dies.
    The standby takes the lock, then refuses the schema in one line and exits 1: it never
    listens, and it leaves the database as it found it."""
    import asyncpg
    from coordd.store.postgres import schema
    a = rig.coordd("a")
    await a.wait_serving()
    b = rig.coordd("b")
    await b.wait_log("standby: waiting for the active coordd")
    newer = schema.SCHEMA_VERSION + 1
    conn = await asyncpg.connect(rig.dsn)
    try:
        await conn.execute("INSERT INTO coordd_schema_version (version) VALUES ($1)", newer)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(5)
        assert await asyncio.to_thread(b.proc.wait, 30) == 1, b.log()
        assert f"database schema v{newer} is newer than this coordd" in b.log(), b.log()
        assert "does not migrate down" in b.log() and "Traceback" not in b.log(), b.log()
        assert not os.path.exists(b.socket)
        assert await conn.fetchval("SELECT max(version) FROM coordd_schema_version") == newer
    finally:
        await conn.close()


async def test_an_active_coordd_whose_lock_session_ends_exits_at_once(rig):
    """Never two serving: the server ends the active's lock session (as its keepalives or
    idle_session_timeout would for a partitioned host); it exits 3 and the standby leads."""
    import asyncpg
    a = rig.coordd("a")
    await a.wait_serving()
    b = rig.coordd("b")
    await b.wait_log("standby: waiting for the active coordd")
    conn = await asyncpg.connect(rig.dsn)
    try:  # the active's lock session: the one granted the advisory lock
        pid = await conn.fetchval("SELECT pid FROM pg_locks WHERE locktype = 'advisory' "
                                  "AND granted")
        cut = time.monotonic()
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await conn.close()
    assert await asyncio.to_thread(a.proc.wait, 10) == 3
    exited_s = time.monotonic() - cut
    assert exited_s < 3.0
    assert "leadership lost" in a.log()
    await b.wait_serving()
    assert not os.path.exists(a.socket)  # it stopped listening before it went


async def test_a_parked_claim_is_woken_by_an_enqueue_through_listen(rig):
    a = rig.coordd("a")
    await a.wait_serving()
    async with Client(a.socket, timeout=10) as c, Client(a.socket, timeout=10) as admin:
        await c.heartbeat("w1", ["cpu"], COOL)
        parked = asyncio.ensure_future(c.claim("w1", 30, "c1", wait_s=10))
        await asyncio.sleep(0.3)
        assert not parked.done()
        sent = time.monotonic()
        job = (await admin.enqueue(kind="m", required_role="cpu", priority=1,
                                   payload={})).job_id
        res = await asyncio.wait_for(parked, 5)
        woke_s = time.monotonic() - sent
        assert res.job is not None and res.job.job_id == job and res.waited_s >= 0.3
        assert woke_s < 0.5  # the NOTIFY, not the 1 s poll
        # nothing to claim: answered empty at wait_s
        res = await c.claim("w1", 30, "c2", wait_s=0.3)
        assert res.job is None


@pytest.mark.slow
async def test_failover_drill_two_takeovers_under_load(rig):
    """The long drill: two workers on both coordds, 40 jobs; the active is SIGKILLed, it
    comes back as the standby, then the new active is SIGKILLed too. Every job succeeds
    exactly once; no lease is expired by either fail-over; take-over times printed."""
    a = rig.coordd("a")
    await a.wait_serving()
    b = rig.coordd("b")
    await b.wait_log("standby: waiting for the active coordd")
    sockets = [a.socket, b.socket]
    async with Client(a.socket, timeout=10) as c:
        ids = [(await c.enqueue(kind="m", required_role="cpu", priority=1,
                                payload={"echo": i, "sleep": 0.4})).job_id for i in range(40)]
    for wid in ("w1", "w2"):
        rig.worker(wid, sockets, slots=2, lease_s=8, claim_wait_s=2)
    takeovers = []
    for active, standby, name in ((a, b, "a"), (None, None, "b")):
        if active is None:  # second round: b leads, a (restarted) waits
            active, standby = b, rig.coordd("a2", socket=a.socket)
            await standby.wait_log("standby: waiting for the active coordd")

        async def busy(d: Coordd = active) -> bool:
            async with Client(d.socket, timeout=5) as cl:
                return (await cl.status()).active_leases >= 3
        await until(busy, 30, "the workers hold leases")
        killed = time.monotonic()
        active.proc.send_signal(signal.SIGKILL)
        active.proc.wait(5)
        takeovers.append(await standby.wait_serving() - killed)
    print("\ntake-over times (SIGKILL -> standby serving): "
          + ", ".join(f"{t * 1000:.0f} ms" for t in takeovers))
    last = rig.coordds[-1]
    async with Client(last.socket, timeout=10) as c:
        jobs = await _all_done(c, ids, 120)
    assert all(_once(j) for j in jobs), [
        (j.job_id, j.status, [(e.to_status, e.reason) for e in j.events]) for j in jobs
        if not _once(j)]
    assert max(takeovers) < 5.0


async def test_a_frozen_active_loses_the_lock_to_the_standby_and_exits_when_it_wakes(rig):
    """A host that stops answering (SIGSTOP: as a partition looks to the server): the
    server ends its silent lock session after store_session_timeout_s, the standby leads;
    the old active, woken, finds its session gone and exits 3 at once."""
    a = rig.coordd("a", session_timeout_s=1.5)
    await a.wait_serving()
    b = rig.coordd("b", session_timeout_s=1.5)
    await b.wait_log("standby: waiting for the active coordd")
    a.proc.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        took = await b.wait_serving() - frozen
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert 0.8 < took < 5.0, b.log()  # not before the session timeout (less a probe)
    print(f"\ntake-over of a frozen active (store_session_timeout_s = 1.5): {took * 1000:.0f} ms")
    assert await asyncio.to_thread(a.proc.wait, 10) == 3
    assert "leadership lost" in a.log()


def test_an_unreachable_store_is_one_line_and_exit_1(pg_dsn, tmp_path):
    dead = pg_dsn.replace("port=", "port=1")  # nobody listens there
    done = subprocess.run([sys.executable, "-m", "coordd", "--store", dead, "--socket",
                           str(tmp_path / "x.sock")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("coordd: cannot reach the store (host ") and \
        len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "x.sock").exists()
