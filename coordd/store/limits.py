"""SQL of fleet-wide limits (issue 17): what jobs consume, who holds units, the rate
windows, reported usage and the runtime overrides; and the claim's limit check.

The rule not to break: a unit is held from the claim that takes it to the end of that
lease, in the same transactions. Holds are written by `ClaimLimits.take` beside the new
lease, and deleted by the `limit_holds_release` trigger on every lease row that goes
(complete, fail, release, reap, a lost worker, a pruned job): no code path can end a
lease and keep its units. The trigger exists whenever a limit is defined or a unit is
held (dropped at start otherwise: `settle_release_trigger`). Rate claims are rows too
(consumed at claim, never returned), so a restart or a SIGKILL cannot reset a window.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

import msgspec

from coordd.rules.limits import (
    LimitBook, budget_refusal, concurrency_refusal, limit_view, rate_excess, rate_refusal_text,
)
from coordd.wire.limits import LimitView

# The limits migration (issue 17): its own step, so the lead can renumber it at merge.
MIGRATION_LIMITS = """
    CREATE TABLE job_limits (
        job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
        name   TEXT NOT NULL,
        units  INTEGER NOT NULL CHECK (units >= 1),
        PRIMARY KEY (job_id, name)
    ) WITHOUT ROWID;
    CREATE INDEX job_limits_name ON job_limits (name, job_id);
    CREATE TABLE limit_holds (
        name      TEXT NOT NULL,
        job_id    TEXT NOT NULL,
        units     INTEGER NOT NULL,
        priority  INTEGER NOT NULL,
        worker_id TEXT NOT NULL,
        since     REAL NOT NULL,
        PRIMARY KEY (name, job_id)
    ) WITHOUT ROWID;
    CREATE INDEX limit_holds_job ON limit_holds (job_id);
    CREATE TRIGGER limit_holds_release AFTER DELETE ON leases BEGIN
        DELETE FROM limit_holds WHERE job_id = OLD.job_id;
    END;
    CREATE TABLE limit_claims (
        name  TEXT NOT NULL,
        at    REAL NOT NULL,
        units INTEGER NOT NULL
    );
    CREATE INDEX limit_claims_window ON limit_claims (name, at);
    CREATE TABLE limit_usage (
        name   TEXT NOT NULL,
        metric TEXT NOT NULL,
        at     REAL NOT NULL,
        amount REAL NOT NULL
    );
    CREATE INDEX limit_usage_window ON limit_usage (name, metric, at);
    CREATE TABLE limit_overrides (
        name          TEXT PRIMARY KEY,
        settings_json TEXT NOT NULL,
        updated_at    REAL NOT NULL
    )
"""

# The release trigger exists while units may be held: a lease delete runs it (a DELETE
# on limit_holds) for nothing while no limit is defined and no unit held, so the start
# drops it then (`settle_release_trigger`); defining a limit creates it again, in the
# transaction that stores it, before any claim can take a unit.
SQL_RELEASE_TRIGGER = (
    "CREATE TRIGGER IF NOT EXISTS limit_holds_release AFTER DELETE ON leases BEGIN "
    "DELETE FROM limit_holds WHERE job_id = OLD.job_id; END"
)
SQL_DROP_RELEASE_TRIGGER = "DROP TRIGGER IF EXISTS limit_holds_release"
SQL_ANY_HOLD = "SELECT 1 FROM limit_holds LIMIT 1"
SQL_ATTACH = "INSERT INTO job_limits (job_id, name, units) VALUES (?, ?, ?)"
SQL_JOB_LIMITS = "SELECT name, units FROM job_limits WHERE job_id = ?"
# The claim's look at a candidate: its limits, with the units of each held now (one step).
SQL_CANDIDATE_LIMITS = (
    "SELECT jl.name, jl.units, (SELECT coalesce(sum(h.units), 0) FROM limit_holds h "
    "WHERE h.name = jl.name) FROM job_limits jl WHERE jl.job_id = ?"
)
SQL_HELD = "SELECT coalesce(sum(units), 0) FROM limit_holds WHERE name = ?"
SQL_INSERT_HOLD = (
    "INSERT INTO limit_holds (name, job_id, units, priority, worker_id, since) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
SQL_PRUNE_CLAIMS = "DELETE FROM limit_claims WHERE name = ? AND at <= ?"
SQL_WINDOW_USED = "SELECT coalesce(sum(units), 0) FROM limit_claims WHERE name = ? AND at > ?"
# When the oldest claims of the window (?1 name, after ?2) holding ?3 units have left it:
# the time of the claim at which their running sum reaches ?3, plus the window.
SQL_WINDOW_FREES = (
    "SELECT at FROM (SELECT at, sum(units) OVER (ORDER BY at ROWS UNBOUNDED PRECEDING) "
    "AS run FROM limit_claims WHERE name = ?1 AND at > ?2) WHERE run >= ?3 ORDER BY at LIMIT 1"
)
SQL_INSERT_CLAIM = "INSERT INTO limit_claims (name, at, units) VALUES (?, ?, ?)"
SQL_PRUNE_USAGE = "DELETE FROM limit_usage WHERE name = ? AND metric = ? AND at <= ?"
SQL_USAGE = ("SELECT coalesce(sum(amount), 0) FROM limit_usage "
             "WHERE name = ? AND metric = ? AND at > ?")
SQL_INSERT_USAGE = "INSERT INTO limit_usage (name, metric, at, amount) VALUES (?, ?, ?, ?)"
SQL_HOLDERS = (
    "SELECT h.job_id, h.worker_id, h.priority, h.units, h.since FROM limit_holds h "
    "WHERE h.name = ? ORDER BY h.since, h.job_id"
)
SQL_WAITING_FOR = (
    "SELECT count(*) FROM job_limits jl JOIN jobs j ON j.job_id = jl.job_id "
    "WHERE jl.name = ? AND j.status = 'waiting'"
)
SQL_OVERRIDES = "SELECT name, settings_json FROM limit_overrides ORDER BY name"
SQL_SET_OVERRIDE = (
    "INSERT INTO limit_overrides (name, settings_json, updated_at) VALUES (?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET settings_json = excluded.settings_json, "
    "updated_at = excluded.updated_at"
)
SQL_DROP_OVERRIDE = "DELETE FROM limit_overrides WHERE name = ?"
SQL_DROP_CLAIMS = "DELETE FROM limit_claims WHERE name = ?"
# clock steps: a rate window measures a duration (coordd.store.clock_steps)
SQL_SHIFT_CLAIMS = "UPDATE limit_claims SET at = at + ?"
SQL_SHIFT_USAGE = "UPDATE limit_usage SET at = at + ?"


def attach(conn: sqlite3.Connection, job_id: str, uses: list[tuple[str, int]]) -> None:
    """Record the limits a new job consumes [(name, units)] (none: nothing to do)."""
    if uses:
        conn.executemany(SQL_ATTACH, [(job_id, n, u) for n, u in uses])


def job_limits(conn: sqlite3.Connection, job_id: str) -> list[tuple[str, int]]:
    """[(name, units)] a job consumes, by name."""
    return sorted(conn.execute(SQL_JOB_LIMITS, (job_id,)).fetchall())


def window_used(conn: sqlite3.Connection, name: str, now: float, window_s: float) -> int:
    """Units claimed in the rate window ending at `now`."""
    return conn.execute(SQL_WINDOW_USED, (name, now - window_s)).fetchone()[0]


def window_frees(conn: sqlite3.Connection, name: str, now: float, window_s: float,
                 units: int) -> float | None:
    """When `units` of the window's oldest claims have left it (None: it holds fewer)."""
    row = conn.execute(SQL_WINDOW_FREES, (name, now - window_s, units)).fetchone()
    return None if row is None else row[0] + window_s


def held(conn: sqlite3.Connection, name: str) -> int:
    """Units of `name` held by running jobs."""
    return conn.execute(SQL_HELD, (name,)).fetchone()[0]


def usage(conn: sqlite3.Connection, name: str, metric: str, now: float, window_s: float
          ) -> float:
    """Usage of `metric` reported against `name` in the window ending at `now`."""
    return conn.execute(SQL_USAGE, (name, metric, now - window_s)).fetchone()[0]


class ClaimLimits:
    """The limit check of one claim, inside its transaction: `admits` a candidate or says
    why not (first `detail`, earliest `next_slot_at` of a rate), and `take` records the
    units of the job taken. Readings are cached for the claim (nothing changes in it
    before the take). `prune` False: a read-only look (a waiting job's reason), which
    leaves the windows' old rows in place."""

    def __init__(self, conn: sqlite3.Connection, now: float, book: LimitBook,
                 prune: bool = True) -> None:
        self.conn, self.now, self.book, self._prune = conn, now, book, prune
        self.detail: str | None = None
        self.next_slot_at: float | None = None
        self._uses: dict[str, list[tuple[str, int]]] = {}
        self._window: dict[str, int] = {}
        self._usage: dict[tuple[str, str], float] = {}

    def admits(self, priority: int, job_id: str) -> bool:
        """True when every limit the job names has room for a job of `priority`; a
        limit no longer defined holds nothing back."""
        rows = self.conn.execute(SQL_CANDIDATE_LIMITS, (job_id,)).fetchall()
        if not rows:
            return True
        parts = []
        for name, units, held_now in rows:
            limit = self.book.defs.get(name)
            if limit is None:
                continue
            why = []
            if limit.concurrency is not None:
                c = concurrency_refusal(limit, held_now, units, priority)
                if c is not None:
                    why.append(c)
            if limit.rate_n:
                excess = rate_excess(limit, self._rate_used(name, limit.rate_window_s), units,
                                     priority)
                if excess:
                    free_at = window_frees(self.conn, name, self.now, limit.rate_window_s,
                                           excess)
                    why.append(rate_refusal_text(limit, priority, free_at, self.now))
                    if free_at is not None and (self.next_slot_at is None
                                                or free_at < self.next_slot_at):
                        self.next_slot_at = free_at
            for metric, (_amount, window_s, _t) in limit.budget.items():
                b = budget_refusal(limit, metric, self._used(name, metric, window_s), priority)
                if b is not None:
                    why.append(b)
            if why:
                parts.append(f"limit {name}: " + "; ".join(why))
        if parts:
            if self.detail is None:
                self.detail = "; ".join(parts)
            return False
        self._uses[job_id] = [(name, units) for name, units, _ in rows]
        return True

    def take(self, job_id: str, worker_id: str, priority: int) -> None:
        """Hold the units of the job just taken (its lease row is in), and use its rate."""
        for name, units in self._uses.get(job_id, ()):
            self.conn.execute(SQL_INSERT_HOLD, (name, job_id, units, priority, worker_id,
                                                self.now))
            limit = self.book.defs.get(name)
            if limit is not None and limit.rate_n:
                self.conn.execute(SQL_INSERT_CLAIM, (name, self.now, units))

    def _rate_used(self, name: str, window_s: float) -> int:
        got = self._window.get(name)
        if got is None:
            if self._prune:
                self.conn.execute(SQL_PRUNE_CLAIMS, (name, self.now - window_s))
            got = self._window[name] = window_used(self.conn, name, self.now, window_s)
        return got

    def _used(self, name: str, metric: str, window_s: float) -> float:
        got = self._usage.get((name, metric))
        if got is None:
            if self._prune:
                self.conn.execute(SQL_PRUNE_USAGE, (name, metric, self.now - window_s))
            got = self._usage[(name, metric)] = usage(self.conn, name, metric, self.now,
                                                      window_s)
        return got


def record_usage(conn: sqlite3.Connection, now: float, job_id: str,
                 reported: Mapping[str, float], book: LimitBook) -> int:
    """Count a completed job's reported usage against each of its limits that has a
    budget on that metric; return the rows written."""
    n = 0
    for name, _units in conn.execute(SQL_JOB_LIMITS, (job_id,)).fetchall():
        limit = book.defs.get(name)
        for metric, amount in reported.items():
            if limit is not None and metric in limit.budget and amount > 0:
                conn.execute(SQL_INSERT_USAGE, (name, metric, now, float(amount)))
                n += 1
    return n


def overrides(conn: sqlite3.Connection) -> list[tuple[str, dict[str, Any]]]:
    """The stored runtime overrides [(name, settings)]; rows that do not decode are skipped."""
    out = []
    for name, text in conn.execute(SQL_OVERRIDES):
        try:
            settings = msgspec.json.decode(text)
        except msgspec.DecodeError:
            continue
        if isinstance(settings, dict):
            out.append((name, settings))
    return out


def settle_release_trigger(conn: sqlite3.Connection, now: float, active: bool) -> bool:
    """At start (a writer op): keep the `limit_holds_release` trigger while a limit is
    defined (`active`) or a unit is held, else drop it; True when it is kept."""
    if active or conn.execute(SQL_ANY_HOLD).fetchone() is not None:
        conn.execute(SQL_RELEASE_TRIGGER)
        return True
    conn.execute(SQL_DROP_RELEASE_TRIGGER)
    return False


def set_override(conn: sqlite3.Connection, now: float, name: str,
                 settings: dict[str, Any] | None, rate_dropped: bool) -> None:
    """Store (or with None delete) the runtime override of `name`; a limit whose rate
    went away forgets its window. A limit defined here may be claimed against as soon as
    this commits: the release trigger is created with it (see SQL_RELEASE_TRIGGER)."""
    if settings is None:
        conn.execute(SQL_DROP_OVERRIDE, (name,))
    else:
        conn.execute(SQL_RELEASE_TRIGGER)
        conn.execute(SQL_SET_OVERRIDE, (name, msgspec.json.encode(settings).decode(), now))
    if rate_dropped:
        conn.execute(SQL_DROP_CLAIMS, (name,))


def holders(conn: sqlite3.Connection, name: str) -> list[tuple[str, str, int, int, float]]:
    """(job_id, worker_id, priority, units, since) of the jobs holding units of `name`."""
    return conn.execute(SQL_HOLDERS, (name,)).fetchall()


def waiting_for(conn: sqlite3.Connection, name: str) -> int:
    """Waiting jobs that name `name`."""
    return conn.execute(SQL_WAITING_FOR, (name,)).fetchone()[0]


def shift_times(conn: sqlite3.Connection, step: float) -> int:
    """Move rate-window and usage times by a wall-clock step (coordd.store.clock_steps)."""
    return (conn.execute(SQL_SHIFT_CLAIMS, (step,)).rowcount
            + conn.execute(SQL_SHIFT_USAGE, (step,)).rowcount)


def read_annotation(conn: sqlite3.Connection, now: float, book: LimitBook, job_id: str,
                    priority: int, waiting: bool) -> tuple[list[tuple[str, int]], str | None]:
    """The limits a job consumes and, if `waiting`, why they hold it back (SQLite)."""
    uses = job_limits(conn, job_id)
    if not (uses and waiting):
        return uses, None
    return uses, limit_reasons(conn, now, book, [(job_id, priority)]).get(job_id)


def limit_reasons(conn: sqlite3.Connection, now: float, book: LimitBook,
                  jobs: list[tuple[str, int]]) -> dict[str, str]:
    """Why each of `jobs` (id, priority) waits for a limit, for those a limit holds back."""
    check = ClaimLimits(conn, now, book, prune=False)
    out = {}
    for job_id, prio in jobs:
        check.detail = None
        if not check.admits(prio, job_id) and check.detail is not None:
            out[job_id] = check.detail
    return out


def read_views(conn: sqlite3.Connection, now: float, book: LimitBook, names: list[str],
               with_holders: bool) -> list[LimitView]:
    """The LimitViews of `names` (SQLite reads, `limit_view` builds them)."""
    out = []
    for name in names:
        limit = book.defs[name]
        rate_used = window_used(conn, name, now, limit.rate_window_s) \
            if limit.rate_n else 0
        frees = None
        if limit.rate_n and rate_used >= limit.rate_n:  # full: when its oldest unit frees
            frees = window_frees(conn, name, now, limit.rate_window_s,
                                             rate_used - limit.rate_n + 1)
        out.append(limit_view(
            limit, now, held(conn, name), rate_used, frees,
            {m: usage(conn, name, m, now, b[1]) for m, b in limit.budget.items()},
            waiting_for(conn, name),
            holders(conn, name) if with_holders else []))
    return out
