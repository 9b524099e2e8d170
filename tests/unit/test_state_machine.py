"""A property-based state machine over the store API (issue 7, item 1).

Random sequences of enqueue / heartbeat / claim / renew / checkpoint / complete / fail /
cancel / retry / reap with the clock jumping forward; after every step the invariants are
checked against the rows:
- at most one lease per job, and a job is `running` if and only if it has a lease;
- a job's lease token only grows;
- a `succeeded` job's result never changes;
- no accepted complete came from a lease that was expired or superseded at that moment;
- the counts `status` reports equal the counts in the table.
Each op runs as the writer runs it: BEGIN IMMEDIATE, a SAVEPOINT, COMMIT.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test,
)

from coordd import errors, store
from coordd.store import jobs, workers
from coordd.rules import gates
from coordd.store.sqlite import leases
from coordd.store import views
from coordd.store.sqlite.job_changes import JobChanges

WORKERS = ("w1", "w2", "w3")
POLICY = leases.ClaimPolicy(policies=gates.default_policies(), heartbeat_stale_s=30.0,
                           aging_interval_s=0.0)
COOL = '{"memory_used_pct": 40, "temperature_c": 40, "on_battery": false, "user_idle_s": 9999}'
HOT = '{"memory_used_pct": 95, "temperature_c": 40, "on_battery": false, "user_idle_s": 9999}'


def no_backoff(attempts: int) -> float:
    return 2.0 * attempts


class CoordMachine(RuleBasedStateMachine):
    """The store under random operations, with a model of what must stay true."""

    @initialize()
    def setup(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.conn = sqlite3.connect(str(Path(self.dir.name) / "sm.db"), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        store.migrate(self.conn)
        self.changes = JobChanges()  # the counters, kept as the writer keeps them
        self.changes.open(self.conn)
        self.now = 1000.0
        self.seq = 0
        self.jobs: list[str] = []
        self.grants: list[tuple[str, str, int]] = []  # every (job, worker, token) ever granted
        self.max_token: dict[str, int] = {}
        self.results: dict[str, str] = {}

    def teardown(self) -> None:
        if hasattr(self, "conn"):
            self.conn.close()
            self.dir.cleanup()

    def run(self, op):
        self.conn.execute("BEGIN IMMEDIATE")
        self.changes.begin(self.conn)
        self.conn.execute("SAVEPOINT op")
        try:
            out = op(self.conn, self.now)
        except errors.CoordError as exc:
            self.conn.execute("ROLLBACK TO op")
            self.changes.undo(0)
            out = exc
        self.conn.execute("RELEASE op")
        self.changes.flush(self.conn)
        self.conn.execute("COMMIT")
        self.changes.committed()
        return out

    def lease_row(self, job_id: str):
        return self.conn.execute("SELECT worker_id, token, expires_at FROM leases WHERE job_id=?",
                                 (job_id,)).fetchone()

    # ------------------------------------------------------------ rules

    @rule(priority=st.integers(0, 3), max_attempts=st.integers(1, 3))
    def enqueue(self, priority: int, max_attempts: int) -> None:
        self.seq += 1
        job = store.NewJob(job_id=f"j{self.seq}", kind="k", required_role="cpu",
                           priority=priority, payload_json='{"n": %d}' % self.seq, run_at=None,
                           max_attempts=max_attempts, idempotency_key=None, max_runtime_s=None,
                           gates_json=None)
        res = self.run(lambda c, now: jobs.enqueue(c, now, job))
        assert res.created
        self.jobs.append(job.job_id)

    @rule(worker=st.sampled_from(WORKERS), hot=st.booleans())
    def heartbeat(self, worker: str, hot: bool) -> None:
        self.run(lambda c, now: workers.heartbeat(c, now, worker, '["cpu"]', HOT if hot else COOL))

    @rule(worker=st.sampled_from(WORKERS), lease_s=st.sampled_from([5.0, 30.0]),
          fresh=st.booleans())
    def claim(self, worker: str, lease_s: float, fresh: bool) -> None:
        if fresh:
            self.heartbeat(worker, hot=False)
        res = self.run(lambda c, now: leases.claim(c, now, worker, lease_s, None, POLICY))
        if res.job is not None:
            job_id, token = res.job.job_id, res.lease.token
            assert token > self.max_token.get(job_id, 0), "lease token did not grow"
            self.max_token[job_id] = token
            self.grants.append((job_id, worker, token))

    @precondition(lambda self: bool(self.grants))
    @rule(data=st.data())
    def renew(self, data) -> None:
        if self.grants:
            job_id, worker, token = data.draw(st.sampled_from(self.grants))
            before = self.lease_row(job_id)
            res = self.run(lambda c, now: leases.renew(c, now, job_id, worker, token, 30.0))
            if not isinstance(res, errors.CoordError):
                assert before is not None and before[:2] == (worker, token)
                assert self.now < before[2]

    @precondition(lambda self: bool(self.grants))
    @rule(data=st.data())
    def checkpoint(self, data) -> None:
        if self.grants:
            job_id, worker, token = data.draw(st.sampled_from(self.grants))
            self.run(lambda c, now: leases.checkpoint(c, now, job_id, worker, token, '{"s": 1}'))

    @precondition(lambda self: bool(self.grants))
    @rule(data=st.data(), value=st.integers(0, 9))
    def complete(self, data, value: int) -> None:
        if not self.grants:
            return
        job_id, worker, token = data.draw(st.sampled_from(self.grants))
        before = self.lease_row(job_id)
        res = self.run(lambda c, now: leases.complete(c, now, job_id, worker, token,
                                                      f'{{"v": {value}}}', None))
        if not isinstance(res, errors.CoordError):
            assert before is not None and before[:2] == (worker, token), \
                "complete accepted from a superseded lease"
            assert self.now < before[2], "complete accepted from an expired lease"
            if res.status == "succeeded":
                event("complete accepted")
                assert job_id not in self.results
                self.results[job_id] = f'{{"v": {value}}}'

    @precondition(lambda self: bool(self.grants))
    @rule(data=st.data(), retryable=st.booleans())
    def fail(self, data, retryable: bool) -> None:
        if self.grants:
            job_id, worker, token = data.draw(st.sampled_from(self.grants))
            self.run(lambda c, now: leases.fail(c, now, job_id, worker, token, "boom",
                                               retryable, no_backoff))

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data) -> None:
        if self.jobs:
            job_id = data.draw(st.sampled_from(self.jobs))
            self.run(lambda c, now: jobs.cancel(c, now, job_id))

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def retry(self, data) -> None:
        if self.jobs:
            job_id = data.draw(st.sampled_from(self.jobs))
            self.run(lambda c, now: jobs.retry(c, now, job_id))

    @rule()
    def reap(self) -> None:
        self.run(lambda c, now: jobs.reap_expired(c, now))

    @rule(dt=st.floats(0.0, 60.0, allow_nan=False))
    def advance(self, dt: float) -> None:
        self.now += dt

    # ------------------------------------------------------------ invariants

    @invariant()
    def one_lease_iff_running(self) -> None:
        if not hasattr(self, "conn"):
            return
        bad = self.conn.execute(
            "SELECT count(*) FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id "
            "WHERE (j.status = 'running') != (l.job_id IS NOT NULL)").fetchone()[0]
        assert bad == 0, "a running job without a lease, or a lease on a non-running job"
        dup = self.conn.execute(
            "SELECT count(*) - count(DISTINCT job_id) FROM leases").fetchone()[0]
        assert dup == 0

    @invariant()
    def tokens_match_and_grow(self) -> None:
        if not hasattr(self, "conn"):
            return
        for job_id, token, last in self.conn.execute(
                "SELECT l.job_id, l.token, j.last_token FROM leases l JOIN jobs j USING (job_id)"):
            assert token == last == self.max_token[job_id]

    @invariant()
    def results_never_change(self) -> None:
        if not hasattr(self, "conn"):
            return
        for job_id, result in self.results.items():
            row = self.conn.execute("SELECT status, result_json FROM jobs WHERE job_id=?",
                                    (job_id,)).fetchone()
            assert row == ("succeeded", result)

    @invariant()
    def status_counts_equal_table(self) -> None:
        if not hasattr(self, "conn"):
            return
        _, _, leases, jobs, _, _ = views.status_counts(self.conn, self.now, 30.0)
        assert sum(jobs.values()) == len(self.jobs)
        for status, n in jobs.items():
            assert n == self.conn.execute("SELECT count(*) FROM jobs WHERE status=?",
                                          (status,)).fetchone()[0]
        assert leases == jobs["running"]


DEFAULT_EXAMPLES, SLOW_EXAMPLES, STEPS = 40, 1000, 50
CoordMachine.TestCase.settings = settings(
    max_examples=DEFAULT_EXAMPLES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_store_state_machine = CoordMachine.TestCase


@pytest.mark.slow
@pytest.mark.timeout(900)  # its own budget: the suite's 120 s stops it half-way
def test_store_state_machine_long():
    """The same machine, SLOW_EXAMPLES sequences of up to STEPS steps (`pytest -m slow`)."""
    run_state_machine_as_test(CoordMachine, settings=settings(
        max_examples=SLOW_EXAMPLES, stateful_step_count=STEPS, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
    print(f"\nstate machine: {SLOW_EXAMPLES} examples x up to {STEPS} steps, "
          f"invariants checked after every step")
