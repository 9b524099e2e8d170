"""A checkpoint record's `previous` entries (the resume fallbacks, worker.checkpoints) are
files the database refers to: prune keeps them, backup copies them, restore re-points them."""

from __future__ import annotations

import os
import sqlite3

from coordd import cas
from coordd.store import views
from coordd.wire.protocol import Checkpoint
from coordd.store import reads


async def test_prune_keeps_the_files_a_records_previous_entries_name(make_bundle, tmp_path):
    b = await make_bundle()
    store = b.coord.artifact_dir

    def put(data: bytes) -> dict:
        src = tmp_path / "src.bin"
        src.write_bytes(data)
        f = cas.store_file(store, str(src))
        os.utime(f.path, (b.clock.wall() - 10_000, b.clock.wall() - 10_000))
        return {"path": f.path, "sha256": f.sha256, "size": f.size, "name": data.decode()}

    await b.worker("w1")
    job = await b.enqueue()
    c = await b.claim("w1")
    new, old, dropped = put(b"new"), put(b"old"), put(b"dropped")
    await b.coord.checkpoint(Checkpoint(job_id=job, worker_id="w1", token=c.lease.token,
                                        checkpoint={**new, "previous": [old, {"junk": 1}]}))
    res = await b.coord.prune()
    assert res.artifact_files == 1 and not os.path.exists(dropped["path"])
    assert os.path.exists(new["path"]) and os.path.exists(old["path"])


def test_restore_statement_re_points_every_entry(tmp_path):
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE jobs (job_id TEXT, checkpoint_json TEXT)")
    conn.executemany("INSERT INTO jobs VALUES (?, ?)", [
        ("a", '{"sha256": "s1", "path": "/x/s1", "previous": [{"sha256": "s0", "path": "/x/s0"}]}'),
        ("b", "not json"), ("c", '{"previous": {"sha256": "s9"}}'), ("d", None)])
    rows = conn.execute(reads.SQL_CHECKPOINT_REFS).fetchall()
    assert sorted(rows) == [("a", "$", "s1", "/x/s1"), ("a", "$.previous[0]", "s0", "/x/s0")]
    for job, key, sha, _ in rows:
        conn.execute(reads.SQL_SET_CHECKPOINT_PATH, (key, f"/new/{sha}", job))
    assert views.artifact_refs(_with_artifacts(conn)) == {"s1": "/new/s1", "s0": "/new/s0"}


def _with_artifacts(conn: sqlite3.Connection) -> sqlite3.Connection:
    conn.execute("CREATE TABLE artifacts (sha256 TEXT, path TEXT)")
    return conn
