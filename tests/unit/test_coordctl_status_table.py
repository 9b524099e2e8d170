"""`coordctl status`'s database row: SQLite's sizes, and no "0 B (WAL 0 B)" from a store
that reports none (the PostgreSQL store)."""

from __future__ import annotations

import io

from rich.console import Console

from coordctl.render import status_table
from coordd.protocol import StatusReply


def _text(st: StatusReply) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(status_table(st, []))
    return out.getvalue()


def _reply(**sizes: int) -> StatusReply:
    return StatusReply(workers=0, workers_live=0, active_leases=0, jobs={},
                       waiting_by_priority={}, **sizes)


def test_sqlite_sizes_are_shown():
    assert "8.0 KiB (WAL 4.0 KiB)" in _text(_reply(db_bytes=8192, wal_bytes=4096))


def test_a_store_without_sizes_says_so():
    text = _text(_reply())
    assert "size not reported by this store" in text and "0 B" not in text
