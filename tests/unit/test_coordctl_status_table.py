"""`coordctl status`'s database row: SQLite's sizes, and no "0 B (WAL 0 B)" from a store
that reports none (the PostgreSQL store)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from coordctl.render import status_table
from coordd.wire.protocol import StatusReply


def _text(st: StatusReply) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(status_table(st, []))
    return out.getvalue()


def _reply(**sizes: int) -> StatusReply:
    return StatusReply(workers=0, workers_live=0, active_leases=0, jobs={},
                       waiting_by_priority={}, **sizes)


def test_sqlite_sizes_are_shown():
    assert "8.0 KiB (WAL 4.0 KiB)" in _text(_reply(db_bytes=8192, wal_bytes=4096))


def test_a_store_without_a_wal_shows_its_size_alone():
    """The PostgreSQL store reports the database's size and no WAL (SQLite's file)."""
    text = _text(_reply(db_bytes=8_700_000))
    assert "8.3 MiB" in text and "WAL" not in text


def test_a_store_without_sizes_says_so():
    text = _text(_reply())
    assert "size not reported by this store" in text and "0 B" not in text


def test_status_lists_the_oldest_waiting_and_show_says_when_a_suspension_resumes():
    """Issue 31 items 8 and 9 as `coordctl` prints them: `status` names the oldest
    waiting jobs `status` sent, P0 first, with why; `show` of a suspended job whose gates
    are open says when it resumes."""
    from coordctl import render
    from coordd.wire.protocol import JobView, LeaseView, WaitingJob
    from coordd.wire.governance import Suspension
    st = StatusReply(workers=1, workers_live=1, active_leases=0, jobs={"waiting": 2},
                     waiting_by_priority={"p0": 1, "p3": 1}, warnings=["late"],
                     waiting=[WaitingJob(job_id="a1", kind="train", required_role="cpu",
                                         priority=0, waited_s=1201.0,
                                         reason="no live worker runs kind train")])
    rows = [{"job_id": w.job_id, "kind": w.kind, "required_role": w.required_role,
             "priority": w.priority, "age_s": w.waited_s, "waiting_reason": w.reason}
            for w in st.waiting]
    out = io.StringIO()
    render.status(Console(file=out, width=200), st, rows, list(st.warnings))
    text = out.getvalue()
    assert re.search(r"a1 +train +cpu +P0 +20m01s +no live worker runs kind train", text)
    job = JobView(job_id="j1", kind="k", required_role="cpu", priority=3,
                  effective_priority=3, status="running", attempts=1, max_attempts=3,
                  run_at=0.0, created_at=0.0, updated_at=0.0, age_s=0.0,
                  lease=LeaseView(worker_id="w1", token=1, granted_at=0.0, expires_at=1e9,
                                  lease_s=600.0,
                                  governance=Suspension(suspended_at=100.0,
                                                        suspend_reason="on_battery",
                                                        resume_at=170.0)))
    out = io.StringIO()
    render.job(Console(file=out, width=200), job)
    assert ("suspended since 1970-01-01T00:01:40Z (on_battery), resumes at "
            "1970-01-01T00:02:50Z if its gates stay open") in out.getvalue()
