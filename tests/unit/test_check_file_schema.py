"""`coordctl check PATH` on a database a newer coordd migrated: read-only as ever, and
the line says the schema is newer than this coordd's (it printed the number alone, so
the check passed with nothing said about why coordd then refuses the file)."""

from __future__ import annotations

import sqlite3

from coordctl.commands import _check_line
from coordd.store.schema import SCHEMA_VERSION
from coordd.store.sqlite.offline import check_file


def _db(tmp_path, version: int):
    """A file with a jobs table at schema `version`."""
    db = tmp_path / "coordd.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, status TEXT)")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()
    return db


def test_a_newer_schema_is_named_and_the_file_is_left_alone(tmp_path):
    db = _db(tmp_path, SCHEMA_VERSION + 1)
    before = db.read_bytes()
    res = check_file(str(db))
    assert res["schema_version"] == SCHEMA_VERSION + 1
    assert (f"schema version: {SCHEMA_VERSION + 1} (newer than this coordd's "
            f"{SCHEMA_VERSION})") in _check_line(res)
    assert db.read_bytes() == before


def test_a_known_schema_says_the_number_alone(tmp_path):
    db = _db(tmp_path, SCHEMA_VERSION)
    assert _check_line(check_file(str(db))).endswith(f"schema version: {SCHEMA_VERSION}")
