"""Hostile files and resources (issue 7, item 5): a read-only database (folder or file) and a
full disk during commit. Socket path too long / in a missing folder, a non-SQLite file and a
truncated one are covered in test_daemon_lifecycle.py (test_startup_*), not repeated here.

Tests run as root in the container, and root ignores chmod: "read-only" here is a read-only
tmpfs mount (a real EROFS, which root cannot bypass); the chmod variant runs only as non-root.
The full disk is a 2 MiB tmpfs. Where mounting is not allowed the test skips, saying so.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from coordd import errors
from coordd.client import Client

BAD_LOG_WORDS = ("Traceback", "Event loop is closed", "Task was destroyed",
                 "Task exception was never retrieved")


def _mount(target: Path, *opts: str) -> None:
    target.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts), "tmpfs", str(target)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode}); "
                    "needs root with CAP_SYS_ADMIN")


def _remount(target: Path, *opts: str) -> None:
    subprocess.run(["mount", "-o", ",".join(("remount", *opts)), str(target)], check=True)


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, size) -> a fresh tmpfs under tmp_path; all unmounted at teardown."""
    mounted: list[Path] = []

    def make(name: str, *opts: str) -> Path:
        p = tmp_path / name
        _mount(p, "mode=0755", *opts)
        mounted.append(p)
        return p

    yield make
    for p in reversed(mounted):
        subprocess.run(["umount", "-l", str(p)], capture_output=True)


def fill_disk(filler: Path) -> None:
    """Take every free byte of `filler`'s file system (unbuffered: a buffered writer keeps
    the bytes ENOSPC refused and fails again at close)."""
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def run_coordd(*argv: str, timeout: float = 15.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordd", *argv], capture_output=True,
                          text=True, timeout=timeout)


def assert_one_line_refusal(res: subprocess.CompletedProcess, *words: str) -> str:
    assert res.returncode == 1, f"exit {res.returncode}: {res.stderr}"
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{res.stderr}"
    assert lines[0].startswith("coordd: ") and "Traceback" not in res.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def quick_check(db: str, immutable: bool = False) -> list[str]:
    """quick_check on a read-only connection (immutable: the file is on a read-only mount,
    where a WAL database cannot be opened otherwise: no -shm can be made)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro" + ("&immutable=1" if immutable else ""),
                           uri=True)
    try:
        return [r[0] for r in conn.execute("PRAGMA quick_check")]
    finally:
        conn.close()


def make_db(daemon_factory, folder: Path, n: int = 50) -> tuple[str, list[str]]:
    """A coordd DB in `folder` with n jobs, written by a real coordd and cleanly stopped."""
    d = daemon_factory(name="maker")
    d.db = str(folder / "c.db")
    d.start()
    ids = asyncio.run(_enqueue_n(d.socket, n))
    assert d.stop() == 0
    return d.db, ids


async def _enqueue_n(sock: str, n: int) -> list[str]:
    async with Client(sock, timeout=10) as c:
        return [(await c.enqueue(kind="k", required_role="cpu", priority=1,
                                 payload={"i": i})).job_id for i in range(n)]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# ------------------------------------------------------------------ read-only


def test_db_in_readonly_folder_refused(tmpfs, tmp_path):
    ro = tmpfs("ro_empty", "ro")
    assert _really_readonly(ro)
    res = run_coordd("--db", str(ro / "c.db"), "--socket", str(tmp_path / "c.sock"))
    assert res.returncode == 1, f"exit {res.returncode}: {res.stderr}"
    # one "coordd: ..." line; a stray aiosqlite traceback is a separate bug (test below)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("coordd: ")]
    assert len(lines) == 1 and str(ro / "c.db") in lines[0], res.stderr
    assert "unable to open" in lines[0] or "read-only" in lines[0], lines[0]
    assert list(ro.iterdir()) == []
    assert not (tmp_path / "c.sock").exists(), "the socket is removed after a refusal"


def test_db_open_failure_prints_only_one_line(tmpfs, tmp_path):
    ro = tmpfs("ro_empty2", "ro")
    for i in range(20):
        res = run_coordd("--db", str(ro / "c.db"), "--socket", str(tmp_path / "c.sock"))
        assert res.returncode == 1
        assert len(res.stderr.strip().splitlines()) == 1, f"start {i}:\n{res.stderr}"


def _really_readonly(p: Path) -> bool:
    try:
        (p / f".probe-{uuid.uuid4().hex}").write_bytes(b"")
    except OSError:
        return True
    return False


def test_readonly_db_file_on_readonly_mount(tmpfs, daemon_factory, tmp_path):
    folder = tmpfs("ro_db", "size=16m")
    db, ids = make_db(daemon_factory, folder)
    _remount(folder, "ro")
    assert _really_readonly(folder)
    before = _snapshot(folder)
    res = run_coordd("--db", db, "--socket", str(tmp_path / "c.sock"))
    if res.returncode == 0:
        pytest.fail(f"coordd exited 0 on a read-only database: {res.stderr}")
    assert res.returncode == 1, f"exit {res.returncode}: {res.stderr}"
    # one "coordd: ..." line
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("coordd: ")]
    assert len(lines) == 1 and db in lines[0], res.stderr
    assert "read" in lines[0].lower() or "unable to open" in lines[0], lines[0]
    assert _snapshot(folder) == before, "a refused start changed the files"
    assert quick_check(db, immutable=True) == ["ok"]
    conn = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        assert {r[0] for r in conn.execute("SELECT job_id FROM jobs")} == set(ids)
    finally:
        conn.close()


@pytest.mark.skipif(os.geteuid() == 0,
                    reason="root bypasses chmod 0444 (CAP_DAC_OVERRIDE); the read-only mount "
                           "test above covers it with a real EROFS")
def test_readonly_db_file_chmod(daemon_factory, tmp_path):
    folder = tmp_path / "chm"
    folder.mkdir()
    db, _ids = make_db(daemon_factory, folder)
    os.chmod(db, 0o444)
    before = _snapshot(folder)
    res = run_coordd("--db", db, "--socket", str(tmp_path / "c.sock"))
    assert_one_line_refusal(res, db)
    assert _snapshot(folder) == before
    assert quick_check(db) == ["ok"]


# ------------------------------------------------------------------ full disk


async def test_full_disk_during_commit(tmpfs, daemon_factory):
    folder = tmpfs("small", "size=2m")
    d = daemon_factory(name="full")
    d.db = str(folder / "c.db")
    d.start()
    acked: dict[str, int] = {}
    full_errors: list[errors.CoordError] = []
    blob = "x" * 3000
    async with Client(d.socket, timeout=15) as c:
        for i in range(5000):
            try:
                r = await c.enqueue(kind="k", required_role="cpu", priority=1,
                                    payload={"i": i, "blob": blob},
                                    idempotency_key=f"full-{i}")
            except errors.CoordError as exc:
                if type(exc).__name__ == "Disconnected":
                    raise AssertionError(f"coordd dropped the connection on a full disk:\n"
                                         f"{d.log()}") from exc
                full_errors.append(exc)
                if len(full_errors) >= 5:
                    break
                continue
            acked[r.job_id] = i
        assert full_errors, "the 2 MiB disk never filled"
        print(f"full disk: {len(acked)} enqueues acknowledged, then "
              f"{len(full_errors)} refused: {full_errors[0].code}: {full_errors[0]}")
        for exc in full_errors:
            assert exc.code == "unavailable", (exc.code, str(exc))  # retryable, with reason
            assert str(exc).startswith("disk full"), str(exc)
        assert d.proc.poll() is None, f"coordd died on a full disk:\n{d.log()}"

        # reads keep working, and `status` says why writes are refused
        st = await c.status()
        assert sum(st.jobs.values()) == len(acked), (st.jobs, len(acked))
        assert any(w.startswith("disk full: writes refused") for w in st.warnings), st.warnings
        for job_id in list(acked)[-5:] + list(acked)[:5]:
            assert (await c.get_job(job_id)).payload["i"] == acked[job_id]
        checked = await c.check()
        print(f"live check on the full disk: {checked}")

    assert quick_check(d.db) == ["ok"]
    rc = d.stop()
    log = d.log()
    for w in BAD_LOG_WORDS:
        assert w not in log, f"{w!r} in coordd's log:\n{log}"
    assert log.count("storage refused a write") == 1, log  # rate-limited, not per batch
    assert log.count("ERROR") <= 2, log
    assert rc == 0, f"coordd exit {rc} after a full disk:\n{log}"
    assert quick_check(d.db) == ["ok"]
    conn = sqlite3.connect(f"file:{d.db}?mode=ro", uri=True)
    try:
        rows = dict(conn.execute("SELECT job_id, json_extract(payload_json, '$.i') FROM jobs"))
    finally:
        conn.close()
    assert {j: rows.get(j) for j in acked} == acked, "acknowledged jobs lost or changed"
    assert len(rows) == len(acked), "a refused enqueue was stored"


async def test_full_disk_recovers_when_space_is_freed(tmpfs, daemon_factory):
    folder = tmpfs("small2", "size=2m")
    d = daemon_factory(name="refill")
    d.db = str(folder / "c.db")
    d.start()
    async with Client(d.socket, timeout=15) as c:
        await c.enqueue(kind="k", required_role="cpu", priority=1, payload={"first": 1})
        filler = folder / "filler"
        fill_disk(filler)
        refused = 0
        for i in range(200):
            try:
                await c.enqueue(kind="k", required_role="cpu", priority=1,
                                payload={"i": i, "blob": "y" * 3000})
            except errors.CoordError as exc:
                assert exc.code == "unavailable", exc.code
                refused += 1
                break
        assert refused, "enqueues never failed with the disk full"
        filler.unlink()
        r = await c.enqueue(kind="k", required_role="cpu", priority=1, payload={"after": 1})
        assert (await c.get_job(r.job_id)).status == "waiting"
    assert d.stop() == 0
    assert quick_check(d.db) == ["ok"]


async def test_full_disk_mid_batch_no_reply_says_nothing_stored_of_a_stored_job(tmpfs):
    """SQLITE_FULL while a batch's big insert spills pages to the WAL makes SQLite roll back
    the whole transaction. The writer must end the batch there: the small enqueue after it
    in the same batch must not be committed on its own (autocommit) while its reply says
    "commit failed, nothing stored" (a client would enqueue it again: a duplicate job)."""
    import random

    from coordd import config as config_mod
    from coordd.clock import FakeClock
    from coordd.wire.protocol import Enqueue
    from coordd.daemon.server import sqlite_coordinator

    folder = tmpfs("small_batch", "size=2m")
    coord = sqlite_coordinator(str(folder / "c.db"), config_mod.load(None), FakeClock(100.0),
                               rng=random.Random(1))
    await coord.start()
    try:
        coord.store.writer._conn.execute("PRAGMA cache_size = 20")  # spill pages mid-transaction
        await coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=1, payload={}))
        await coord.store.writer.checkpoint()  # the file at its size now, not when the background
        st = os.statvfs(folder)          # checkpointer (every 0.1 s) gets to it
        with open(folder / "filler", "wb") as f:
            # 100 KB left: with the WAL file's old frames (~560 KB) reusable once a checkpoint
            # has backfilled them, the big insert still cannot fit
            f.write(b"\0" * (st.f_bavail * st.f_frsize - 100_000))

        def enqueue(payload: dict) -> asyncio.Future:
            return asyncio.ensure_future(coord.enqueue(Enqueue(
                kind="k", required_role="cpu", priority=1, payload=payload)))
        futs = [enqueue({"n": "a"}), enqueue({"n": "big", "x": "y" * 900_000}),
                enqueue({"n": "c"})]
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert any(isinstance(r, errors.CoordError) for r in results), results
        stored = dict(await coord.store.readers.run(lambda conn: conn.execute(
            "SELECT json_extract(payload_json, '$.n'), job_id FROM jobs").fetchall()))
        for name, res in zip(("a", "big", "c"), results):
            assert (name in stored) == (not isinstance(res, BaseException)), (name, res, stored)
    finally:
        await coord.close()
