"""A property-based state machine over the claim with fleet-wide limits (issue 17), beside
tests/unit/test_state_machine.py.

Random sequences of enqueue (naming none, one or two limits, with weights) / claim /
complete / fail / release / cancel / goodbye / reap with a FakeClock moving forward; each
op runs as the writer runs it (BEGIN IMMEDIATE, a SAVEPOINT, COMMIT). Checked:
- concurrency never exceeded: units of running jobs (from job_limits, not the holds) per
  limit stay <= its concurrency, whatever interleaving of claims and lease ends;
- the holds are exactly the running jobs' limits (every lease end released its units; a
  job with two limits holds both or neither);
- reserves: a claim leaves at least the better priorities' reserves free;
- the rate: units claimed in any rolling window (model's own clock of claims) <= N;
- no head-of-line blocking: each claim returns exactly what a brute-force oracle picks
  (the first waiting job in claim order whose limits all have room), or nothing when the
  oracle finds none.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test,
)

from coordd import errors, store
from coordd.store import jobs
from coordd.rules import gates
from coordd.store.sqlite import leases
from coordd.clock import FakeClock
from coordd.rules.limits import LimitBook, LimitSpec
from coordd.store import workers as wkstore

WORKERS = ("w1", "w2")
COOL = '{"memory_used_pct": 40, "temperature_c": 40, "on_battery": false, "user_idle_s": 9999}'
SPECS = {
    "a": LimitSpec(concurrency=3, reserve={"p0": 1}),
    "b": LimitSpec(concurrency=2, reserve={"p1": 1}),
    "r": LimitSpec(rate="3/min", reserve={"p0": 1}),
}
USES = st.sampled_from([[], [("a", 1)], [("a", 2)], [("b", 1)], [("r", 1)], [("a", 1), ("b", 1)],
                        [("b", 1), ("r", 1)], [("a", 3)], [("a", 1), ("b", 2), ("r", 1)]])


class LimitMachine(RuleBasedStateMachine):
    """Claims and lease ends under limits, against a model of what must stay true."""

    @initialize()
    def setup(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.conn = sqlite3.connect(str(Path(self.dir.name) / "lim.db"), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        store.migrate(self.conn)
        self.clock = FakeClock(1000.0)
        self.book = LimitBook(SPECS)
        self.policy = leases.ClaimPolicy(policies=gates.default_policies(),
                                         heartbeat_stale_s=30.0, aging_interval_s=0.0,
                                         limits=self.book)
        self.seq = 0
        self.uses: dict[str, list[tuple[str, int]]] = {}
        self.prio: dict[str, int] = {}
        self.grants: list[tuple[str, str, int]] = []
        self.rate_claims: list[tuple[float, int]] = []  # (at, units) of limit r

    def teardown(self) -> None:
        if hasattr(self, "conn"):
            self.conn.close()
            self.dir.cleanup()

    @property
    def now(self) -> float:
        return self.clock.wall()

    def run(self, op):
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("SAVEPOINT op")
        try:
            out = op(self.conn, self.now)
        except errors.CoordError as exc:
            self.conn.execute("ROLLBACK TO op")
            out = exc
        self.conn.execute("RELEASE op")
        self.conn.execute("COMMIT")
        return out

    # ------------------------------------------------------------ the oracle

    def running_units(self) -> dict[str, int]:
        out = {name: 0 for name in SPECS}
        for name, units in self.conn.execute(
                "SELECT jl.name, jl.units FROM job_limits jl JOIN jobs j USING (job_id) "
                "WHERE j.status = 'running'"):
            out[name] += units
        return out

    def rate_used(self, at: float) -> int:
        window = self.book.defs["r"].rate_window_s
        return sum(u for t, u in self.rate_claims if at - window < t <= at)

    def admissible(self, job_id: str, used: dict[str, int]) -> bool:
        prio = self.prio[job_id]
        for name, units in self.uses[job_id]:
            limit = self.book.defs[name]
            if limit.concurrency is not None and \
                    used[name] + units > limit.concurrency - limit.held_back(prio):
                return False
            if limit.rate_n and \
                    self.rate_used(self.now) + units > limit.rate_n - limit.held_back(prio):
                return False
        return True

    def oracle(self) -> str | None:
        used = self.running_units()
        for (job_id,) in self.conn.execute(
                "SELECT job_id FROM jobs WHERE status = 'waiting' AND run_at <= ? "
                "ORDER BY priority, queued_at, job_id", (self.now,)):
            if self.admissible(job_id, used):
                return job_id
        return None

    # ------------------------------------------------------------ rules

    @rule(priority=st.integers(0, 3), uses=USES)
    def enqueue(self, priority: int, uses: list[tuple[str, int]]) -> None:
        self.seq += 1
        job = store.NewJob(job_id=f"j{self.seq:04d}", kind="k", required_role="cpu",
                           priority=priority, payload_json="{}", run_at=None, max_attempts=3,
                           idempotency_key=None, max_runtime_s=None, gates_json=None,
                           limits=sorted(uses))
        assert self.run(lambda c, now: jobs.enqueue(c, now, job)).created
        self.uses[job.job_id], self.prio[job.job_id] = sorted(uses), priority

    @rule(worker=st.sampled_from(WORKERS), lease_s=st.sampled_from([5.0, 30.0]))
    def claim(self, worker: str, lease_s: float) -> None:
        self.run(lambda c, now: wkstore.heartbeat(c, now, worker, '["cpu"]', COOL))
        expected = self.oracle()
        res = self.run(lambda c, now: leases.claim(c, now, worker, lease_s, None, self.policy))
        got = None if res.job is None else res.job.job_id
        assert got == expected, f"claim took {got}, the oracle picks {expected}"
        if got is None:
            return
        self.grants.append((got, worker, res.lease.token))
        prio = self.prio[got]
        used = self.running_units()
        for name, units in self.uses[got]:
            limit = self.book.defs[name]
            if limit.concurrency is not None:
                assert used[name] <= limit.concurrency - limit.held_back(prio), "reserve"
            if name == "r":
                self.rate_claims.append((self.now, units))
                assert self.rate_used(self.now) <= limit.rate_n - limit.held_back(prio)

    @precondition(lambda self: bool(self.grants))
    @rule(data=st.data(), how=st.sampled_from(["complete", "fail", "fail_permanent",
                                                "release"]))
    def end(self, data, how: str) -> None:
        job_id, worker, token = data.draw(st.sampled_from(self.grants))
        if how == "complete":
            op = lambda c, now: leases.complete(c, now, job_id, worker, token, "1", None)  # noqa: E731
        elif how == "release":
            op = lambda c, now: leases.release(c, now, job_id, worker, token, "vacate", None)  # noqa: E731
        else:
            op = lambda c, now: leases.fail(c, now, job_id, worker, token, "x",  # noqa: E731
                                            how == "fail", lambda n: 0.0)
        self.run(op)

    @precondition(lambda self: bool(self.uses))
    @rule(data=st.data())
    def cancel(self, data) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.uses)))
        self.run(lambda c, now: jobs.cancel(c, now, job_id))

    @rule(worker=st.sampled_from(WORKERS))
    def goodbye(self, worker: str) -> None:
        self.run(lambda c, now: wkstore.goodbye(c, now, worker, None))

    @rule()
    def reap(self) -> None:
        self.run(lambda c, now: jobs.reap_expired(c, now))

    @rule(dt=st.sampled_from([0.0, 0.5, 5.0, 19.5, 20.0, 30.0, 60.0]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    # ------------------------------------------------------------ invariants

    @invariant()
    def concurrency_never_exceeded(self) -> None:
        if not hasattr(self, "conn"):
            return
        used = self.running_units()
        for name, limit in self.book.defs.items():
            if limit.concurrency is not None:
                assert used[name] <= limit.concurrency, f"{name}: {used[name]} running"

    @invariant()
    def holds_are_the_running_jobs_limits(self) -> None:
        if not hasattr(self, "conn"):
            return
        holds = sorted(self.conn.execute(
            "SELECT job_id, name, units FROM limit_holds").fetchall())
        running = sorted(self.conn.execute(
            "SELECT jl.job_id, jl.name, jl.units FROM job_limits jl JOIN leases l USING "
            "(job_id)").fetchall())
        assert holds == running, "a lease end kept its units, or a claim took only some"

    @invariant()
    def rate_never_exceeded(self) -> None:
        if not hasattr(self, "conn"):
            return
        limit = self.book.defs["r"]
        for t, _ in self.rate_claims:  # every window that ends at a claim
            assert self.rate_used(t) <= limit.rate_n


DEFAULT_EXAMPLES, SLOW_EXAMPLES, STEPS = 20, 1000, 50
LimitMachine.TestCase.settings = settings(
    max_examples=DEFAULT_EXAMPLES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_limits_state_machine = LimitMachine.TestCase


@pytest.mark.slow
def test_limits_state_machine_long():
    """The same machine, SLOW_EXAMPLES sequences of up to STEPS steps (`pytest -m slow`)."""
    run_state_machine_as_test(LimitMachine, settings=settings(
        max_examples=SLOW_EXAMPLES, stateful_step_count=STEPS, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
