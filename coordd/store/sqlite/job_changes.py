"""What the writer learns from each job row it changes: the status counters, the kinds
waiting per role, and the rows that may wake a parked call; and the claim's worker rows,
kept until the writer changes them (WorkerRows).

One TEMP trigger per insert, status/priority update and delete of a job calls `row()`
inside the writer's transaction (coordd.store.job_changes), whatever code path made the
change, so no path can forget to count. The rule not to break: what `row()` saw counts
only once its transaction commits. The writer marks the journal before each op, cuts it
back when the op is rolled back, writes the counts with the batch's deltas added in the
batch's own transaction just before COMMIT (`flush`: one UPDATE of the one-row
`job_totals`), and drops them when the batch fails: a crash loses the batch and its
counts together. Rows changed by another connection are not seen:
at open the counters' totals by status are checked against the jobs (one index scan) and
recounted if they differ; while coordd runs, a commit by another connection (PRAGMA
data_version) makes the next batch recount.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any, Protocol

import msgspec

from coordd.store import job_changes as sql
from coordd.store.claim_index import SQL_ROLE_KINDS
from coordd.store.jobs import SQL_WORKER

logger = logging.getLogger(__name__)

KINDS_REFRESH_S = 1.0  # a role's cached kinds are read again after this (drops gone kinds)
WORKER_ROWS_KEPT = 4096  # worker rows kept before starting over
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "skipped"})
_encode = msgspec.json.Encoder().encode


class Listener(Protocol):
    """Who hears of jobs entering waiting or ending (coordd.service.push.Push)."""

    def job_waiting(self, job_id: str, role: str, kind: str, run_at: float | None) -> None:
        """A job entered waiting (`run_at`: set when still ahead); inside the transaction."""

    def job_ended(self, job_id: str) -> None:
        """A job reached a terminal status; inside the transaction."""


class RoleKinds:
    """The kinds that have waiting jobs, per role: what a claim that names no kinds walks.

    A kind is added the moment a job of it enters waiting (never missed); a kind whose
    jobs are gone stays until the role's list is read again (KINDS_REFRESH_S), costing
    one empty index seek per claim meanwhile. Cleared whenever a rollback or another
    connection may have made the list short.
    """

    def __init__(self) -> None:
        self._kinds: dict[str, tuple[list[str], float]] = {}  # role -> (kinds, read at)

    def kinds(self, conn: sqlite3.Connection, role: str, now: float) -> list[str]:
        """The kinds with (or lately with) waiting jobs of `role`, sorted."""
        got = self._kinds.get(role)
        if got is None or not (0 <= now - got[1] < KINDS_REFRESH_S):
            got = ([k for (k,) in conn.execute(SQL_ROLE_KINDS, (role,))], now)
            self._kinds[role] = got
        return got[0]

    def add(self, role: str, kind: str) -> None:
        """A job of (`role`, `kind`) entered waiting."""
        got = self._kinds.get(role)
        if got is not None and kind not in got[0]:
            got[0].append(kind)
            got[0].sort()

    def clear(self) -> None:
        """Forget every role's list (read again at the next claim)."""
        self._kinds.clear()


class WorkerRows:
    """The claim's read of its worker row, (roles_json, heartbeat_json, heartbeat_at), as the
    writer's connection sees it: read once, then kept until a TEMP trigger says the writer
    changed one of those columns (`changed`), or until anything cached may be stale
    (a rollback, another connection's commit: `clear`)."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[Any, ...]] = {}

    def get(self, conn: sqlite3.Connection, worker_id: str) -> tuple[Any, ...] | None:
        """The worker's row, or None when it has none (that is not kept)."""
        row = self._rows.get(worker_id)
        if row is None:
            row = conn.execute(SQL_WORKER, (worker_id,)).fetchone()
            if row is not None:
                if len(self._rows) >= WORKER_ROWS_KEPT:
                    self._rows.clear()
                self._rows[worker_id] = row
        return row

    def changed(self, worker_id: Any) -> None:
        """The writer inserted, updated or deleted the row (the triggers' function; must not
        raise)."""
        self._rows.pop(worker_id, None)

    def clear(self) -> None:
        """Forget every row."""
        self._rows.clear()


class JobChanges:
    """The writer's view of the job rows its batches change (see the module doc)."""

    def __init__(self) -> None:
        self.journal: list[tuple[Any, Any, Any, Any]] = []  # (old status, prio, new, prio)
        self.role_kinds = RoleKinds()
        self.worker_rows = WorkerRows()
        self.listener: Listener | None = None
        # committed counts by (status, priority): what `status` answers, no read needed
        self.counts: dict[tuple[str, int], int] = {}
        self._next: dict[tuple[str, int], int] | None = None  # the batch's, once it commits
        self._data_version: int | None = None
        self._version_seen: int | None = None  # a batch's recount, until it commits
        # coordd.rules.preemption.ReservationHint (or None): raised wherever `role_kinds` is
        # cleared, since a rollback or an outside write may bring a reservation back
        self.reservations: Any = None

    def open(self, conn: sqlite3.Connection) -> None:
        """Load the counters, recounted first if their totals by status differ from the
        jobs' (rows another program wrote while coordd was down), and install the
        triggers on `conn`, the writer's connection, outside any transaction."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            if dict(conn.execute(sql.SQL_STATUS_TOTALS)) != dict(
                    conn.execute(sql.SQL_COUNTED_TOTALS)):
                logger.warning("job counters differ from the jobs table (written by another "
                               "program?); recounted", extra={"action": "counters_recount"})
                self._recount(conn)
            else:
                self.counts = {(s, p): n for s, p, n in conn.execute(sql.SQL_COUNTS_ALL)}
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            self.counts = {}
            raise
        conn.create_function(sql.JOB_FUNCTION, sql.JOB_FUNCTION_ARGS, self.row)
        conn.create_function(sql.WORKER_FUNCTION, 1, self.worker_rows.changed)
        for stmt in (*sql.TRIGGERS, *sql.WORKER_TRIGGERS):
            conn.execute(stmt)
        self._data_version = conn.execute(sql.SQL_DATA_VERSION).fetchone()[0]
        self._doubt()

    def _doubt(self) -> None:
        """What is cached of the file may be stale: forget the kinds and the worker rows,
        raise the hint."""
        self.role_kinds.clear()
        self.worker_rows.clear()
        if self.reservations is not None:
            self.reservations.may_exist()

    def row(self, old_status: Any, old_prio: Any, new_status: Any, new_prio: Any,
            job_id: Any, role: Any, kind: Any, run_at_ahead: Any) -> None:
        """One job row changed (the triggers' function). Must not raise: an error here
        would fail the write that fired it."""
        self.journal.append((old_status, old_prio, new_status, new_prio))
        if new_status == "waiting":
            if old_status != "waiting":
                self.role_kinds.add(role, kind)
                if self.listener is not None:
                    self.listener.job_waiting(job_id, role, kind, run_at_ahead)
        elif new_status in TERMINAL and old_status != new_status and self.listener is not None:
            self.listener.job_ended(job_id)

    def begin(self, conn: sqlite3.Connection) -> None:
        """At the start of a batch (inside its transaction, the write lock held): if
        another connection committed since the last batch, recount and forget the kinds."""
        self._next = None
        version = conn.execute(sql.SQL_DATA_VERSION).fetchone()[0]
        if version != self._data_version:
            if self._data_version is not None:
                logger.warning("another connection wrote to the database; job counters "
                               "recounted", extra={"action": "counters_recount"})
            self._data_version = None  # until the recount commits (see `committed`)
            self._recount(conn)
            self._version_seen = version
            self._doubt()

    def _recount(self, conn: sqlite3.Connection) -> None:
        """Count the jobs into `job_counts` and `counts` (inside a transaction)."""
        for stmt in sql.SQL_RECOUNT:
            conn.execute(stmt)
        self.counts = {(s, p): n for s, p, n in conn.execute(sql.SQL_COUNTS_ALL)}

    def undo(self, mark: int) -> None:
        """The ops since `len(journal)` was `mark` were rolled back: forget their rows."""
        del self.journal[mark:]
        self._doubt()  # a rolled-back take may have dropped a kind still waiting

    def flush(self, conn: sqlite3.Connection) -> None:
        """Write the counts with the batch's deltas added (one UPDATE of `job_totals`),
        in its transaction (before COMMIT); they are what `status` answers once it
        commits. The journal is cleared by `committed()` or `discard()`."""
        if not self.journal:
            return
        delta: dict[tuple[Any, Any], int] = {}
        for old_s, old_p, new_s, new_p in self.journal:
            if old_s is not None:
                delta[(old_s, old_p)] = delta.get((old_s, old_p), 0) - 1
            if new_s is not None:
                delta[(new_s, new_p)] = delta.get((new_s, new_p), 0) + 1
        if not any(delta.values()):
            return
        counts = dict(self.counts)
        for key, n in delta.items():
            counts[key] = counts.get(key, 0) + n
        conn.execute(sql.SQL_COUNTS_SET,
                     (_encode([(s, p, n) for (s, p), n in counts.items() if n]).decode(),))
        self._next = counts

    def committed(self) -> None:
        """The batch committed: its counts are now what `status` answers."""
        self.journal.clear()
        if self._version_seen is not None:
            self._data_version, self._version_seen = self._version_seen, None
        if self._next is not None:
            self.counts, self._next = self._next, None

    def discard(self) -> None:
        """The batch's transaction failed: nothing it changed happened."""
        self.journal.clear()
        self._next = None
        self._version_seen = None  # a recount rolled back: the next batch counts again
        self._doubt()
