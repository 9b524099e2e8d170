"""The v20 -> v21 migration (coordd.store.schema.migrate_jobs_status_check): the jobs
table's status CHECK goes from an IN list to ORs of equalities in the stored table text,
with the rows untouched; the rule is the same (a status outside the seven is refused, on
the migrating connection and on one opened before); an update that sets `status` builds
no ephemeral index any more; a file whose table text is not coordd's, or a SQLite that
refuses to write its schema table, keeps its constraint and is still at v21."""

from __future__ import annotations

import sqlite3

import pytest

from coordd.store import schema

V20 = 20
SET_BAD = "UPDATE jobs SET status = 'lost' WHERE job_id = 'j1'"
INSERT = (
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at) "
    "VALUES ('j1', 'k', 'cpu', 2, '{}', 'waiting', 3, 1, 1, 1, 1)"
)


def _v20(path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    assert schema.migrate(conn, V20) == V20
    conn.execute(INSERT)
    return conn


def _jobs_sql(conn: sqlite3.Connection) -> str:
    return conn.execute(schema.SQL_JOBS_TABLE_SQL).fetchone()[0]


def _ephemeral(conn: sqlite3.Connection) -> int:
    """OpenEphemeral opcodes of an update that sets status (the IN list's index)."""
    return sum(op == "OpenEphemeral" for _a, op, *_ in conn.execute(
        "EXPLAIN UPDATE jobs SET status = 'running' WHERE job_id = ?", ("j1",)))


def test_v20_file_gets_the_or_check_with_its_rows_and_rule(tmp_path):
    path = tmp_path / "v20.db"
    conn = _v20(path)
    other = sqlite3.connect(path, isolation_level=None)  # parsed the v20 schema first
    assert other.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
    assert schema.JOBS_STATUS_CHECK_IN in _jobs_sql(conn)
    assert _ephemeral(conn) == 1
    before = conn.execute("SELECT * FROM jobs").fetchall()

    assert schema.migrate(conn) == schema.SCHEMA_VERSION
    sql = _jobs_sql(conn)
    assert schema.JOBS_STATUS_CHECK_IN not in sql and schema.JOBS_STATUS_CHECK_OR in sql
    assert conn.execute("SELECT * FROM jobs").fetchall() == before
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    for c in (conn, other):
        with pytest.raises(sqlite3.IntegrityError, match="status = 'blocked' OR"):
            c.execute(SET_BAD)
        assert _ephemeral(c) == 0
        for status in ("blocked", "waiting", "running", "succeeded", "failed", "cancelled",
                       "skipped"):
            c.execute("UPDATE jobs SET status = ? WHERE job_id = 'j1'", (status,))
    other.close()
    conn.close()


def test_a_new_file_has_the_or_check(tmp_path):
    conn = sqlite3.connect(tmp_path / "new.db", isolation_level=None)
    assert schema.migrate(conn) == schema.SCHEMA_VERSION
    assert schema.JOBS_STATUS_CHECK_OR in _jobs_sql(conn)
    conn.close()


def test_a_table_text_not_coordds_is_left_as_it_is(tmp_path):
    conn = _v20(tmp_path / "v20.db")
    cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")  # another program reformatted the table
    conn.execute(schema.SQL_SET_JOBS_TABLE_SQL, (_jobs_sql(conn).replace(
        schema.JOBS_STATUS_CHECK_IN, schema.JOBS_STATUS_CHECK_IN.replace("\n", " ")),))
    conn.execute("PRAGMA writable_schema = OFF")
    conn.execute(f"PRAGMA schema_version = {cookie + 1}")
    changed = _jobs_sql(conn)

    assert schema.migrate(conn) == schema.SCHEMA_VERSION
    assert _jobs_sql(conn) == changed
    with pytest.raises(sqlite3.IntegrityError, match="status IN"):
        conn.execute(SET_BAD)
    conn.close()


class _Defensive:
    """A connection whose schema table is read-only (SQLITE_DBCONFIG_DEFENSIVE's refusal)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, *args):
        if sql == schema.SQL_SET_JOBS_TABLE_SQL:
            raise sqlite3.OperationalError("table sqlite_master may not be modified")
        return self._conn.execute(sql, *args)


def test_a_sqlite_that_refuses_schema_writes_keeps_the_in_check(tmp_path):
    conn = _v20(tmp_path / "v20.db")
    assert schema.migrate(_Defensive(conn)) == schema.SCHEMA_VERSION
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    assert conn.execute("PRAGMA writable_schema").fetchone()[0] == 0
    assert schema.JOBS_STATUS_CHECK_IN in _jobs_sql(conn)
    with pytest.raises(sqlite3.IntegrityError, match="status IN"):
        conn.execute(SET_BAD)
    conn.close()
