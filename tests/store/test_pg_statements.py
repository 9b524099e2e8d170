"""Every PostgreSQL statement that writes jobs.status serves a transition of
coordd.rules.transitions (as tests/unit/test_transitions.py holds for SQLite's), and the texts
the one-statement paths write are the state machine's (no database needed)."""

from __future__ import annotations

import re

from coordd.rules import transitions as tr
from coordd.store.postgres import apply, eager_sql, sql

WRITES_STATUS = re.compile(r"UPDATE jobs SET (?:(?!WHERE).)*\bstatus = |INSERT INTO jobs \(",
                           re.S)
STATUS_WRITES = {  # statement -> the transitions it writes (coordd.rules.transitions causes)
    "SQL_ENQUEUE": "enqueue", "SQL_CLAIM": "claim", "SQL_CLAIM_BATCH": "claim",
    "SQL_CLAIM_ROLES": "claim", "SQL_CLAIM_BATCH_ROLES": "claim",
    "SQL_DEAD_LETTER_TAKEN": "dead_letter", "SQL_COMPLETE_BATCH": "complete/cancel_requested",
    "SQL_TO_TERMINAL": "failed/cancelled (apply)", "SQL_TO_WAITING": "fail (apply)",
    "SQL_RELEASE_JOB": "release (apply)", "SQL_RETRY": "retry (apply)",
    "SQL_REAP": "lease_expired/cancel_requested",
    # eager_sql: a complete and its next claim in one statement
    "SQL_COMPLETE_NEXT": "complete/cancel_requested, claim",
    "SQL_COMPLETE_NEXT_ROLES": "complete/cancel_requested, claim",
    "SQL_COMPLETE_NEXT_BATCH": "complete/cancel_requested, claim",
    "SQL_COMPLETE_NEXT_BATCH_ROLES": "complete/cancel_requested, claim",
}


def test_every_status_writing_statement_is_known():
    found = {name for module in (sql, eager_sql) for name, v in vars(module).items()
             if name.startswith("SQL_") and isinstance(v, str) and WRITES_STATUS.search(v)}
    assert found == set(STATUS_WRITES)


def test_one_statement_paths_write_the_state_machines_texts():
    held = tr.Held(tr.RUNNING, True, None, 1, 3, 1, "w", 1, 0.0, 1.0)
    d = tr.complete(held, 0.0, None, False)
    assert apply.COMPLETE_TEXTS == (d.last_error, d.reason)
    cancelled = tr.lost_lease("w7", 1, 3, True, tr.LEASE_EXPIRED, 0.0)
    exhausted = tr.lost_lease("w7", 3, 3, False, tr.LEASE_EXPIRED, 0.0)
    requeued = tr.lost_lease("w7", 1, 3, False, tr.LEASE_EXPIRED, 0.0)
    c_err, c_why, x_err, x_why, before, after, r_why = apply.REAP_TEXTS
    assert (c_err, c_why) == (cancelled.last_error, cancelled.reason)
    assert (x_err, x_why) == (exhausted.last_error, exhausted.reason)
    assert (before + "w7" + after, r_why) == (requeued.last_error, requeued.reason)
