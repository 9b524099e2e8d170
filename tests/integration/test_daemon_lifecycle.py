"""Whole-process lifecycle of coordd: crashes, signals and backups (B20, B22, B23); start-up
refusals are in test_daemon_startup.py, socket activation and sd_notify in
test_daemon_systemd.py.

SQLite only: the database file's lock (a second coordd on the same file, under another
name) and the online backup of the file. PostgreSQL's
counterparts (the advisory-lock standby, `backup` refused for pg_dump) are test_pg_daemon.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordd import errors
from coordd.client import Client

COOL = {"memory_used_pct": 30.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 10_000.0}
EXIT_TIMEOUT_S = 10.0
BAD_LOG_WORDS = ("Traceback", "Event loop is closed", "Task was destroyed",
                 "Task exception was never retrieved", "ResourceWarning")


def db_rows(db: str, sql: str) -> list[tuple]:
    """Run one query on a read-only connection of its own."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def check_file(db: str) -> tuple[str, str]:
    """quick_check and integrity_check of a database file, opened read-only on its own."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        qc = "; ".join(r[0] for r in conn.execute("PRAGMA quick_check"))
        ic = "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check"))
        return qc, ic
    finally:
        conn.close()


def wait_exit(d, timeout: float = EXIT_TIMEOUT_S) -> int:
    return d.proc.wait(timeout)


def assert_clean_log(d) -> None:
    log = Path(d.log_path).read_text(errors="replace")
    for word in BAD_LOG_WORDS:
        assert word not in log, f"{word!r} in coordd's log:\n{log[-4000:]}"


async def enqueue_some(path: str, n: int) -> list[str]:
    async with Client(path, timeout=10) as c:
        batch = await c.enqueue_batch([{"kind": "k", "required_role": "cpu", "priority": 2,
                                        "payload": {"i": i}} for i in range(n)])
        ids = [j.job_id for j in batch.jobs]
        for i in range(5):
            ids.append((await c.enqueue(kind="k", required_role="cpu", priority=1,
                                        payload={"single": i})).job_id)
    return ids


async def run_coordd(*argv: str, timeout: float = 15.0) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "coordd", *argv], capture_output=True,
        text=True, timeout=timeout)


# ------------------------------------------------------------------ B23 socket file


async def test_b23_stale_socket_after_kill9(daemon_factory):
    d = daemon_factory()
    d.start()
    acked = await enqueue_some(d.socket, 50)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    assert os.path.exists(d.socket), "a SIGKILLed coordd cannot remove its socket"
    t0 = time.monotonic()
    d.start(wait=False)
    status = None
    while status is None:
        assert d.proc.poll() is None, d.log()
        assert time.monotonic() - t0 < 5.0, f"not serving: {d.log()}"
        try:
            async with Client(d.socket, timeout=2) as c:
                status = await c.status()
        except errors.CoordError:
            await asyncio.sleep(0.02)
    took = time.monotonic() - t0
    assert took < 2.0, f"status answered {took:.2f}s after the restart"
    assert "removing stale socket" in d.log()
    assert status.jobs["waiting"] == len(acked)
    async with Client(d.socket) as c:
        for job_id in acked:
            assert (await c.get_job(job_id)).status == "waiting"
    assert d.stop() == 0
    assert not os.path.exists(d.socket)


async def test_b23_second_daemon_refused(daemon_factory):
    a = daemon_factory(name="a")
    a.start()
    inode = os.stat(a.socket).st_ino
    b = daemon_factory(name="b")
    b.db, b.socket = a.db, a.socket
    b.start(wait=False)
    assert b.proc.wait(15) == 1
    err = b.log()
    assert "already running" in err and "Traceback" not in err
    assert os.stat(a.socket).st_ino == inode
    async with Client(a.socket) as c:
        assert (await c.status()).workers == 0
    assert a.proc.poll() is None


async def test_b23_second_daemon_refused_without_the_lock(daemon_factory):
    """Even a starter that gets past the lock (e.g. the lock file was deleted) probes the
    socket, finds a live coordd and refuses; A keeps its socket."""
    a = daemon_factory(name="a")
    a.start()
    os.unlink(a.socket + ".lock")
    b = daemon_factory(name="b")
    b.socket = a.socket
    b.start(wait=False)
    assert b.proc.wait(15) == 1
    assert "already running" in b.log()
    async with Client(a.socket) as c:
        await c.status()


@pytest.mark.parametrize("name", ["symlink", "hardlink", "dotdot"])
async def test_second_daemon_on_another_name_of_the_db_refused(daemon_factory, tmp_path, name):
    """The single-daemon lock holds for the file, however it is named (issue 14, bug 3):
    a symlink, a hard link and a `sub/../` path to A's database are refused with exit 1
    and one clear line; A keeps serving, and no second artifact store appears."""
    a = daemon_factory(name="a")
    a.start()
    async with Client(a.socket) as c:  # the file exists once coordd has started
        await c.status()
    other = tmp_path / "other"
    other.mkdir()
    if name == "symlink":
        alias = other / "link.db"
        alias.symlink_to(a.db)
    elif name == "hardlink":
        alias = other / "hard.db"
        os.link(a.db, alias)
    else:
        alias = other / ".." / Path(a.db).name
    res = await run_coordd("--db", str(alias), "--socket", str(tmp_path / "b.sock"))
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "is in use by another process" in lines[0] and str(alias) in lines[0], lines[0]
    assert not (other / "artifacts").exists()
    assert not os.path.exists(str(alias) + "-wal") or name == "dotdot"
    async with Client(a.socket) as c:
        assert (await c.status()).workers == 0
    assert a.proc.poll() is None


def test_artifact_store_follows_the_file_not_the_name(tmp_path):
    """A symlinked or `..` name of the database has the real file's artifact store."""
    from coordd.paths import artifact_dir_for
    real = tmp_path / "state" / "coordd.db"
    real.parent.mkdir()
    real.touch()
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "link.db"
    link.symlink_to(real)
    want = str(real.parent / "artifacts")
    assert artifact_dir_for(link) == want
    assert artifact_dir_for(tmp_path / "elsewhere" / ".." / "state" / "coordd.db") == want


async def test_b23_two_starters_race_on_a_stale_socket_one_wins(daemon_factory):
    """Probe, unlink and bind happen under the lock: of two starters, exactly one serves."""
    a = daemon_factory(name="a")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(a.socket)  # a socket file nothing listens on, as after a crash
    stale.close()
    b = daemon_factory(name="b")
    b.db, b.socket = a.db, a.socket
    a.start(wait=False)
    b.start(wait=False)
    deadline = time.monotonic() + 15
    while a.proc.poll() is None and b.proc.poll() is None:
        assert time.monotonic() < deadline, "neither starter gave up"
        await asyncio.sleep(0.02)
    loser, winner = (a, b) if a.proc.poll() is not None else (b, a)
    assert loser.proc.returncode == 1 and "already running" in loser.log()
    winner.wait_ready()
    async with Client(winner.socket) as c:
        await c.status()
    assert winner.stop() == 0


async def test_b23_regular_file_in_the_way(daemon_factory):
    d = daemon_factory()
    Path(d.socket).write_bytes(b"precious, not a socket\n")
    res = await run_coordd("--db", d.db, "--socket", d.socket)
    assert res.returncode == 1
    assert "not a socket" in res.stderr and "Traceback" not in res.stderr
    assert Path(d.socket).read_bytes() == b"precious, not a socket\n"
    assert not os.path.exists(d.db), "refused before touching the database"


# ------------------------------------------------------------------ SIGTERM


async def test_sigterm_during_enqueue_stream(daemon_factory):
    d = daemon_factory()
    d.start()
    acked: list[str] = []
    enough = asyncio.Event()

    async def producer(i: int) -> None:
        async with Client(d.socket, timeout=15) as c:
            n = 0
            while True:
                try:
                    res = await c.enqueue(kind="k", required_role="cpu", priority=2,
                                          payload={"p": i, "n": n})
                except errors.CoordError:  # overloaded (shutting down) or disconnected
                    return
                acked.append(res.job_id)
                n += 1
                if len(acked) >= 300:
                    enough.set()

    tasks = [asyncio.create_task(producer(i)) for i in range(4)]
    await asyncio.wait_for(enough.wait(), 30)
    d.proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert await asyncio.to_thread(wait_exit, d) == 0
    assert_clean_log(d)
    assert not os.path.exists(d.socket)
    d.start()
    stored = {r[0] for r in db_rows(d.db, "SELECT job_id FROM jobs")}
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged enqueue(s) lost"
    assert len(acked) >= 300


async def test_b20_sigterm_during_backup_and_claims(daemon_factory, tmp_path):
    d = daemon_factory()
    d.start()
    async with Client(d.socket, timeout=30) as c:
        for _ in range(4):  # ~12 MB so that a backup takes a moment
            await c.enqueue_batch([{"kind": "k", "required_role": "cpu", "priority": 2,
                                    "payload": {"blob": "b" * 3000}} for _ in range(1000)])
    stop = asyncio.Event()
    completed: list[str] = []
    backups: list[str] = []
    backup_started = asyncio.Event()

    async def worker(i: int) -> None:
        async with Client(d.socket, timeout=15) as c:
            try:
                await c.heartbeat(f"w{i}", ["cpu"], COOL)
                while not stop.is_set():
                    got = await c.claim(f"w{i}", lease_s=60)
                    if got.job is None:
                        return
                    await c.complete(got.job.job_id, f"w{i}", got.lease.token, {"ok": i})
                    completed.append(got.job.job_id)
            except errors.CoordError:
                return

    async def backer() -> None:
        async with Client(d.socket, timeout=30) as c:
            k = 0
            try:
                while not stop.is_set():
                    dest = str(tmp_path / f"b20-{k}.db")
                    k += 1
                    backup_started.set()
                    res = await c.backup(dest)
                    assert res.quick_check == "ok"
                    backups.append(dest)
            except errors.CoordError:
                return

    tasks = [asyncio.create_task(worker(i)) for i in range(4)]
    tasks.append(asyncio.create_task(backer()))
    await asyncio.wait_for(backup_started.wait(), 10)
    deadline = time.monotonic() + 20
    while len(completed) < 100:
        assert time.monotonic() < deadline and not all(t.done() for t in tasks[:4])
        await asyncio.sleep(0.01)
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(wait_exit, d) == 0
    assert time.monotonic() - t0 < EXIT_TIMEOUT_S
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert_clean_log(d)
    assert "coordd stopped" in d.log()
    assert not os.path.exists(d.socket)
    d.start()
    async with Client(d.socket) as c:
        check = await c.check()
        assert check["quick_check"] == "ok" and check["foreign_key_violations"] == 0
        st = await c.status()
        assert st.jobs["succeeded"] >= len(completed)
    done = {r[0] for r in db_rows(d.db, "SELECT job_id FROM jobs WHERE status='succeeded'")}
    assert set(completed) <= done
    for dest in backups:
        assert check_file(dest) == ("ok", "ok")


# ------------------------------------------------------------------ B22 backups


async def backups_under_load(d, tmp_path: Path, rounds: int) -> None:
    async with Client(d.socket, timeout=30) as c:
        await c.enqueue_batch([{"kind": "k", "required_role": "cpu", "priority": 2,
                                "payload": {"i": i}} for i in range(3000)])
    stop = asyncio.Event()
    completed: list[str] = []
    enqueued: list[str] = []

    async def worker(i: int) -> None:
        async with Client(d.socket, timeout=15) as c:
            await c.heartbeat(f"w{i}", ["cpu"], COOL)
            while not stop.is_set():
                got = await c.claim(f"w{i}", lease_s=60)
                if got.job is None:
                    await asyncio.sleep(0.01)
                    continue
                await c.complete(got.job.job_id, f"w{i}", got.lease.token, {"w": i})
                completed.append(got.job.job_id)

    async def producer() -> None:
        async with Client(d.socket, timeout=15) as c:
            while not stop.is_set():
                res = await c.enqueue(kind="k", required_role="cpu", priority=3, payload=None)
                enqueued.append(res.job_id)

    tasks = [asyncio.create_task(worker(i)) for i in range(4)]
    tasks.append(asyncio.create_task(producer()))
    try:
        async with Client(d.socket, timeout=60) as admin:
            deadline = time.monotonic() + 20
            while len(completed) < 50:
                assert time.monotonic() < deadline, "workers made no progress"
                await asyncio.sleep(0.01)
            for k in range(rounds):
                seen = len(completed)
                while len(completed) < seen + 20:  # commits land between the backups too
                    assert time.monotonic() < deadline + 60, "workers stalled"
                    await asyncio.sleep(0.005)
                done_before, enq_before = set(completed), set(enqueued)
                dest = tmp_path / f"b22-{k}.db"
                res = await admin.backup(str(dest))
                assert res.quick_check == "ok" and res.path == str(dest)
                assert not (tmp_path / f"b22-{k}.db-wal").exists()
                assert not (tmp_path / f"b22-{k}.db-shm").exists()
                assert not list(tmp_path.glob(f"b22-{k}.db.tmp*"))
                assert check_file(str(dest)) == ("ok", "ok")
                assert db_rows(str(dest), "PRAGMA journal_mode") == [("delete",)]
                rows = dict(db_rows(str(dest), "SELECT job_id, status FROM jobs"))
                assert enq_before <= rows.keys(), "acknowledged enqueues missing from backup"
                assert all(rows[j] == "succeeded" for j in done_before), \
                    "acknowledged completions missing from backup"
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    for t in tasks:
        assert t.exception() is None, t.exception()
    assert len(completed) > 100, "the load did not run beside the backups"


async def test_b22_backup_under_load(daemon_factory, tmp_path):
    d = daemon_factory()
    d.start()
    await backups_under_load(d, tmp_path, rounds=5)


@pytest.mark.slow
async def test_b22_backup_under_load_20_rounds(daemon_factory, tmp_path):
    d = daemon_factory()
    d.start()
    await backups_under_load(d, tmp_path, rounds=20)
