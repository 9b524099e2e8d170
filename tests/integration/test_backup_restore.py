"""Restore drill (issue 5): a backup taken while 4 clients keep writing restores, with every
job and artifact readable and matching its hash; a damaged backup or a running coordd on the
target refuses the restore and changes nothing.

SQLite only: `backup` and `restore` copy the database file (PostgreSQL refuses `backup`,
naming pg_dump: test_store_areas_daemon.py)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import threading
from pathlib import Path

from coordd import cas
from coordd.client import SyncClient
from coordd.paths import artifact_dir_for
from tests.integration.conftest import DaemonProc
from tests import ctlfork

COOL = {"memory_used_pct": 10.0}


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return ctlfork.run(list(args), timeout=60)  # python -m coordctl ARGS


def _one_job_backup(sock: str, tmp: Path, after: int = 0) -> Path:
    """Enqueue one job, back it up to `tmp`/bk.db (returned), then enqueue `after` more."""
    dest = tmp / "bk.db"
    with SyncClient(sock, timeout=10) as c:
        c.enqueue(kind="k", required_role="cpu", priority=0)
        c.backup(str(dest))
        for _ in range(after):
            c.enqueue(kind="k", required_role="cpu", priority=0)
    return dest


def _with_artifacts(sock: str, db: str, tmp: Path) -> tuple[dict[str, str], str]:
    """Complete 5 jobs whose results are artifact files, and checkpoint one running job on
    an artifact file. Returns (job_id -> artifact sha256, the checkpointed job's id)."""
    store = artifact_dir_for(db)
    results = {}
    with SyncClient(sock, timeout=10) as c:
        c.heartbeat("wa", ["art"], COOL)
        for i in range(5):
            job = c.enqueue(kind="k", required_role="art", priority=0).job_id
            got = c.claim("wa")
            src = tmp / f"result{i}.bin"
            src.write_bytes(os.urandom(2048) + bytes([i]))
            stored = cas.store_file(store, str(src))
            c.complete(job, "wa", got.lease.token, {"artifact": stored.sha256},
                       artifact={"sha256": stored.sha256, "size": stored.size,
                                 "path": stored.path})
            results[job] = stored.sha256
        job = c.enqueue(kind="k", required_role="art", priority=0).job_id
        got = c.claim("wa", lease_s=600)
        ck = tmp / "ckpt.json"
        ck.write_text('{"step": 40}')
        stored = cas.store_file(store, str(ck))
        c.checkpoint(job, "wa", got.lease.token, {"path": stored.path, "sha256": stored.sha256,
                                                  "size": stored.size, "name": "ckpt.json"})
    return results, job


def test_backup_under_load_restores_with_every_job_and_artifact(daemon_factory, tmp_path):
    d = daemon_factory()
    d.start()
    results, ck_job = _with_artifacts(d.socket, d.db, tmp_path)
    acked: list[str] = []
    stop = threading.Event()

    def writer(n: int) -> None:
        with SyncClient(d.socket, timeout=10) as c:
            c.heartbeat(f"w{n}", ["cpu"], COOL)
            while not stop.is_set():
                job = c.enqueue(kind="k", required_role="cpu", priority=2).job_id
                acked.append(job)
                got = c.claim(f"w{n}")
                if got.job is not None:
                    c.complete(got.job.job_id, f"w{n}", got.lease.token, {"by": n})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        while len(acked) < 100:
            threading.Event().wait(0.02)
        before = list(acked)
        dest = tmp_path / "bk" / "coordd-backup.db"
        dest.parent.mkdir()
        out = ctl("--socket", d.socket, "backup", str(dest))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert out.returncode == 0, out.stderr
    assert "artifacts: 6 copied" in out.stdout and "0 missing" in out.stdout
    assert d.stop() == 0

    target = tmp_path / "restored" / "coordd.db"
    target.parent.mkdir()
    res = ctl("restore", str(dest), "--db", str(target))
    assert res.returncode == 0, res.stderr
    assert "every sha256 verified" in res.stdout

    r = DaemonProc(db=str(target), socket=str(tmp_path / "r.sock"), config=None,
                   log_path=str(tmp_path / "r.log"))
    r.start()
    try:
        new_store = artifact_dir_for(str(target))
        with SyncClient(r.socket, timeout=10) as c:
            for job in before:
                assert c.get_job(job).job_id == job
            for job, sha in results.items():
                view = c.get_job(job)
                assert view.status == "succeeded" and view.artifact.sha256 == sha
                assert view.artifact.path.startswith(new_store)
                assert cas.sha256_file(view.artifact.path)[0] == sha
            ck = c.get_job(ck_job).checkpoint
            assert ck["path"].startswith(new_store)
            assert cas.sha256_file(ck["path"])[0] == ck["sha256"]
            assert c.check()["quick_check"] == "ok"
    finally:
        assert r.stop() == 0


def test_damaged_backup_or_running_coordd_refuses_restore(daemon_factory, tmp_path):
    d = daemon_factory()
    d.start()
    _with_artifacts(d.socket, d.db, tmp_path)
    dest = tmp_path / "bk.db"
    assert ctl("--socket", d.socket, "backup", str(dest)).returncode == 0

    live = ctl("restore", str(dest), "--db", d.db)  # coordd holds the database's lock
    assert live.returncode == 1 and "invalid_state" in live.stderr, live.stderr
    with SyncClient(d.socket, timeout=10) as c:
        assert c.status().jobs["succeeded"] == 5

    art = next(p for p in Path(str(dest) + ".artifacts").rglob("*") if p.is_file())
    data = art.read_bytes()
    art.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # one byte changed (always)
    target = tmp_path / "t" / "coordd.db"
    target.parent.mkdir()
    bad = ctl("restore", str(dest), "--db", str(target))
    assert bad.returncode == 1 and "restore_refused" in bad.stderr, bad.stderr
    assert "does not match" in bad.stderr
    assert not target.exists() and not Path(artifact_dir_for(str(target))).exists()
    assert len(bad.stderr.strip().splitlines()) == 1


def test_restore_over_a_database_keeps_the_replaced_one_beside_it(daemon_factory, tmp_path):
    """The database a restore replaces is kept, whole (its WAL too: coordd is SIGKILLed
    here, so what it committed last may be only there), and the output says where."""
    d = daemon_factory()
    d.start()
    dest = _one_job_backup(d.socket, tmp_path, after=2)
    d.kill()
    res = ctl("restore", str(dest), "--db", d.db)
    assert res.returncode == 0, res.stderr
    kept = [p for p in Path(d.db).parent.iterdir() if p.name.startswith("d.db.replaced-")
            and not p.name.endswith("-wal")]
    assert len(kept) == 1 and f"kept at {kept[0]}" in res.stdout, (res.stdout, kept)
    for path, jobs in ((kept[0], 3), (Path(d.db), 1)):
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == jobs
        conn.close()
    assert not Path(d.db + "-wal").exists() or Path(d.db + "-wal").stat().st_size == 0


def test_a_backup_from_a_newer_coordd_is_refused_and_nothing_is_replaced(daemon_factory,
                                                                        tmp_path):
    """A backup whose schema is newer than this coordd's was installed (this coordd's SQL
    run on it first), leaving a database coordd then refused to start on. Now restore
    refuses it before anything changes."""
    import hashlib
    import json

    from coordd.store.schema import SCHEMA_VERSION
    d = daemon_factory()
    d.start()
    dest = _one_job_backup(d.socket, tmp_path)
    d.stop()
    conn = sqlite3.connect(dest)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")  # as a newer one writes it
    conn.close()
    manifest = Path(str(dest) + ".manifest.json")
    doc = json.loads(manifest.read_text())
    doc["db"]["sha256"] = hashlib.sha256(dest.read_bytes()).hexdigest()
    manifest.write_text(json.dumps(doc))
    before = Path(d.db).read_bytes()
    res = ctl("restore", str(dest), "--db", d.db)
    assert res.returncode == 1 and "restore_refused" in res.stderr, res.stderr
    assert f"schema v{SCHEMA_VERSION + 1} is newer" in res.stderr, res.stderr
    assert Path(d.db).read_bytes() == before
    assert not [p for p in Path(d.db).parent.iterdir() if ".replaced-" in p.name]
