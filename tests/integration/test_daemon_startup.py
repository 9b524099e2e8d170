"""coordd's start-up refusals: a socket path too long or in a missing folder, a database in a
missing folder, a file that is not a database, is truncated or was migrated by a newer
coordd. Each is one line on stderr, exit 1, and the file is left as it was (SQLite only:
PostgreSQL's are in test_pg_daemon.py).
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from coordd import store
from tests.integration.test_daemon_lifecycle import enqueue_some, run_coordd


def _assert_one_line_refusal(res: subprocess.CompletedProcess, *words: str) -> None:
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{res.stderr}"
    assert lines[0].startswith("coordd: ")
    for w in words:
        assert w in lines[0], lines[0]


async def test_startup_socket_path_too_long(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    res = await run_coordd("--db", str(tmp_path / "x.db"), "--socket", str(deep / "c.sock"))
    _assert_one_line_refusal(res, "too long")
    assert not (tmp_path / "x.db").exists()


async def test_startup_socket_folder_missing(tmp_path):
    res = await run_coordd("--db", str(tmp_path / "x.db"),
                           "--socket", str(tmp_path / "nope" / "c.sock"))
    _assert_one_line_refusal(res, "does not exist", "nope")


async def test_startup_db_folder_missing(tmp_path):
    res = await run_coordd("--db", str(tmp_path / "nope" / "x.db"),
                           "--socket", str(tmp_path / "c.sock"))
    _assert_one_line_refusal(res, "does not exist", "nope")
    assert not (tmp_path / "c.sock").exists(), "the socket is removed after a refusal"


async def test_startup_db_not_sqlite_left_unchanged(tmp_path):
    db = tmp_path / "notes.db"
    content = b"These are my notes, not a database.\n" * 200
    db.write_bytes(content)
    res = await run_coordd("--db", str(db), "--socket", str(tmp_path / "c.sock"))
    _assert_one_line_refusal(res, "not a database", str(db))
    assert db.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.sock.lock", "notes.db", "notes.db.lock"]


async def test_startup_db_truncated(daemon_factory, tmp_path):
    d = daemon_factory()
    d.start()
    await enqueue_some(d.socket, 2000)
    assert d.stop() == 0
    data = Path(d.db).read_bytes()
    assert len(data) > 64 * 1024
    db = tmp_path / "cut.db"
    db.write_bytes(data[: len(data) // 2])
    res = await run_coordd("--db", str(db), "--socket", str(tmp_path / "c.sock"))
    _assert_one_line_refusal(res, str(db))
    assert "malformed" in res.stderr or "not a database" in res.stderr
    assert db.read_bytes() == data[: len(data) // 2]


async def test_startup_db_migrated_by_a_newer_coordd_is_refused_and_left_unchanged(
        daemon_factory, tmp_path):
    d = daemon_factory()
    d.start()
    await enqueue_some(d.socket, 20)
    assert d.stop() == 0
    conn = sqlite3.connect(d.db)
    conn.execute(f"PRAGMA user_version = {store.SCHEMA_VERSION + 1}")  # as a newer one leaves it
    conn.commit()
    conn.close()
    data = Path(d.db).read_bytes()
    res = await run_coordd("--db", d.db, "--socket", str(tmp_path / "c.sock"))
    _assert_one_line_refusal(res, f"v{store.SCHEMA_VERSION + 1} is newer than this coordd",
                             "does not migrate down")
    assert Path(d.db).read_bytes() == data
