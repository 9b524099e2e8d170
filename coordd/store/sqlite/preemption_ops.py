"""SQLite's preemption walk and the claim's look at reservations, inside the writer's
transaction (the decisions: coordd.rules.preemption.choose, pure)."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection

from coordd.rules.gates import GatePolicy
from coordd.rules.preemption import (
    CANDIDATES_MAX, Held, Look, PreemptPolicy, Preemptor, ReservationHint, choose,
)
from coordd.store.jobs import event
from coordd.store import resources as resstore
from coordd.store.governance import (
    SQL_ALL_HELD, SQL_ANY_PREEMPTOR, SQL_ANY_RESERVATION, SQL_DELETE_LAPSED_RESERVATIONS,
    SQL_DELETE_RESERVATION, SQL_INSERT_RESERVATION, SQL_LIVE_WORKERS, SQL_MARK_VACATE,
    SQL_PREEMPTING_CANDIDATES, SQL_RESERVATIONS, SQL_RESERVED_FOR_WORKER,
)


def run(conn: sqlite3.Connection, now: float, policies: dict[int, GatePolicy],
        pacer: Preemptor) -> list[tuple[str, str, str]]:
    """`preempt` paced by `pacer`: [] when its last full look was under
    `scan_interval_s` ago."""
    return preempt(conn, now, policies, pacer.policy, pacer, pacer.hint)


def preempt(conn: sqlite3.Connection, now: float, policies: dict[int, GatePolicy],
            policy: PreemptPolicy, pacer: Preemptor | None = None,
            hint: ReservationHint | None = None) -> list[tuple[str, str, str]]:
    """Drop lapsed reservations; for each waiting job that could preempt and that no live
    worker has room for, vacate one victim and reserve its capacity (`hint` raised
    first; the choice is `choose`). Returns [(waiting job, victim job, worker)]."""
    conn.execute(SQL_DELETE_LAPSED_RESERVATIONS, (now,))
    if policy.gap <= 0:
        return []
    if conn.execute(SQL_ANY_PREEMPTOR, (3 - policy.gap,)).fetchone() is None:
        return []  # the common case, answered from the counters
    if pacer is not None and not pacer.due(now):
        return []
    waiting = conn.execute(SQL_PREEMPTING_CANDIDATES,
                           (3 - policy.gap, now, CANDIDATES_MAX)).fetchall()
    if not waiting:
        return []
    workers = conn.execute(SQL_LIVE_WORKERS, (now - policy.stale_s,)).fetchall()
    held: dict[str, list[Held]] = {}
    for row in conn.execute(SQL_ALL_HELD):
        held.setdefault(row[0], []).append(Held(*row[:6], vacating=row[6] is not None))
    reserved: dict[str, int] = {}
    for worker_id, *_ in conn.execute(SQL_RESERVATIONS):
        reserved[worker_id] = reserved.get(worker_id, 0) + 1
    needs = resstore.requests_of(conn, [row[0] for row in waiting])
    grants = resstore.grants_by_job(conn) if needs else {}
    look = Look(waiting=waiting, workers=workers, held=held, reserved=reserved, needs=needs,
                grants=grants)
    done: list[tuple[str, str, str]] = []
    for p in choose(look, policies, policy, now):
        victim = p.victim
        conn.execute(SQL_MARK_VACATE, (p.why, victim.job_id))
        event(conn, victim.job_id, now, victim.worker_id, "running", "running",
              f"vacate: {p.why}")
        if hint is not None:
            hint.may_exist()
        conn.execute(SQL_INSERT_RESERVATION, (p.job_id, victim.worker_id, victim.job_id, now,
                                              now + policy.reservation_s))
        event(conn, p.job_id, now, victim.worker_id, "waiting", "waiting", p.reserved_text)
        done.append((p.job_id, victim.job_id, victim.worker_id))
    return done


def reserved_claim(conn: sqlite3.Connection, now: float, worker_id: str,
                   hint: ReservationHint | None = None,
                   kinds: Collection[str] | None = None) -> str | None:
    """The claim's look at reservations on `worker_id`: the reserved job still waiting, of
    one of `kinds` (None: any) the claim names, to be taken first, or None. Reservations
    whose job no longer waits are dropped; one of another kind stays. With a `hint` that
    says none can exist, no look; one that finds none for this worker checks whether the
    table is empty, and if so lowers the hint."""
    if hint is not None and not hint.maybe:
        return None
    for job_id, status, kind in conn.execute(SQL_RESERVED_FOR_WORKER,
                                             (worker_id, now)).fetchall():
        if status == "waiting":
            if kinds is None or kind in kinds:
                return job_id
            continue
        conn.execute(SQL_DELETE_RESERVATION, (job_id,))
    if hint is not None and conn.execute(SQL_ANY_RESERVATION).fetchone() is None:
        hint.maybe = False
    return None
