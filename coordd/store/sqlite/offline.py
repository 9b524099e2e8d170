"""What the admin does to a SQLite file without a daemon: `coordctl check PATH` (`check_file`,
read-only) and `coordctl restore` (coordd.store.sqlite.backup's `restore`, re-exported). The
one store module coordctl imports (pyproject.toml's `clients` contract allows exactly it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from coordd.store import reads, views
from coordd.store.schema import SCHEMA_VERSION
from coordd.store.sqlite.backup import (  # noqa: F401 (coordctl restore)
    RestoreRefused, ownership_problem, restore,
)

SQL_HAS_JOBS = "SELECT 1 FROM sqlite_master WHERE type='table' AND name='jobs'"


def check_file(path: str) -> dict[str, Any]:
    """Open a SQLite file read-only and run quick_check and foreign_key_check on it; say
    its schema version and this coordd's (`schema_version_known`).

    Raises:
        FileNotFoundError: no such file.
        sqlite3.Error: not a SQLite database (or unreadable).
    """
    p = Path(path).expanduser().absolute()
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    conn = sqlite3.connect(p.as_uri() + "?mode=ro", uri=True)
    try:
        qc, fk = views.integrity(conn)
        res: dict[str, Any] = {"path": str(p), "quick_check": qc,
                               "foreign_key_violations": len(fk), "violations": fk[:100]}
        res["schema_version"] = conn.execute(reads.SQL_USER_VERSION).fetchone()[0]
        res["schema_version_known"] = SCHEMA_VERSION  # higher: a newer coordd's database
        if conn.execute(SQL_HAS_JOBS).fetchone():
            res["jobs"] = views.count_jobs(conn)
        return res
    finally:
        conn.close()
