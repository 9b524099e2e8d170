"""The job state machine: every allowed transition of a job and of a workflow, and the
pure decisions that pick one. Like all of coordd.rules it may import wire and the base
modules only (the layers contract), and its modules import nothing of each other but
table.py (and fencing.py's Held).

Rows in, decisions out: no SQL, no connection, no I/O. A store reads the fields a decision
names, calls it, and applies what it returns with its own statements (the SQLite store in
coordd.store.jobs and coordd.store.sqlite.leases; another store with its own SQL). The one
rule: a store writes a job's `status` only as a decision from here says, so every change a
reader can see in `job_events` is a row of TABLE (tests/unit/test_transitions.py).

table.py (statuses, causes, TABLE, WORKFLOW_TABLE, Decision), fencing.py (Held, fence,
renew), outcomes.py (complete, fail, release, lost_lease, dead_letter, backoff_delay),
admin.py (cancel, retry) and workflows.py (a workflow's settle). Callers use them through
this package (`from coordd.rules import transitions as tr`; `tr.fence`, `tr.TABLE`).
"""

from __future__ import annotations

from coordd.rules.transitions.table import (  # noqa: F401 (the package's names)
    BLOCKED, CANCEL, CANCEL_HONOURED, CANCEL_NOW, CANCEL_REQUEST, CANCEL_REQUESTED,
    CANCELLED, CLAIM, CLAIMED, COMPLETE, COMPLETED, DEAD_LETTER, DEAD_LETTERED,
    DEPENDENCIES_MET, DEPENDENCY_ENDED, ENQUEUE, ENQUEUED, ENQUEUED_BLOCKED, FAIL,
    FAIL_FAILED, FAIL_RETRY, FAILED, INVALID_FAILED, INVALID_RETRY, JOB_STATUSES,
    LEASE_EXPIRED, LOST, LOST_LEASE_CODES, NODE_TERMINAL, PARTIAL, PROMOTED, REBLOCKED,
    RELEASE, RELEASED, REOPEN, RESULT_INVALID, RETRIED, RETRY, RUNNING, SETTLE, SKIPPED,
    SKIPPED_ABSENT, SKIPPED_DEP, SUCCEEDED, TABLE, UNSKIPPED, WAITING, WORKER_ABSENT,
    WORKER_LOST, WORKFLOW_ENDS, WORKFLOW_TABLE, Decision, Transition,
)
from coordd.rules.transitions.fencing import Held, fence, renew  # noqa: F401
from coordd.rules.transitions.outcomes import (  # noqa: F401
    Backoff, backoff_delay, claimed_reason, complete, dead_letter, fail, lost_lease, release,
)
from coordd.rules.transitions.admin import CANCELLED_BY_ADMIN, cancel, retry  # noqa: F401
from coordd.rules.transitions.workflows import (  # noqa: F401
    Node, NodeStep, Settlement, absent_reason, node_payload, settle, summarize,
)
