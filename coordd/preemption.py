"""Priority preemption: a waiting job that no worker has room for takes the place of a
running job at least `preempt_gap` priorities lower, and the capacity it frees is
reserved for it.

`choose_victim` is pure. `preempt` runs inside the writer's transaction (on each
heartbeat): it marks the victim's lease `vacate` (coordd.governance then tells its holder
on every heartbeat and renew until `release`) and inserts a reservation, so the claim of
that worker takes the waiting job first (`reserved_claim`) until the reservation lapses
after `reservation_s`. A worker's room comes from the `slots_total` / `slots` readings it
sends; a worker that sends none is never counted full, so it never loses a job here.
The claim skips its look at reservations while `ReservationHint` says none can exist;
the rule not to break: the hint is raised before any reservation can be stored or come
back (an insert here, a rollback, another connection's write) and lowered only by a look
that found the table empty.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from coordd import gates, resources
from coordd.gates import GatePolicy
from coordd.jsontext import lenient_json
from coordd.store import event
from coordd.store import resources as resstore
from coordd.store.governance import (
    SQL_ALL_HELD, SQL_ANY_PREEMPTOR, SQL_DELETE_LAPSED_RESERVATIONS, SQL_DELETE_RESERVATION,
    SQL_INSERT_RESERVATION, SQL_LIVE_WORKERS, SQL_MARK_VACATE, SQL_PREEMPTING_CANDIDATES,
    SQL_ANY_RESERVATION, SQL_RESERVATIONS, SQL_RESERVED_FOR_WORKER,
)

CANDIDATES_MAX = 16  # waiting jobs looked at per scan, best first


class PreemptPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The config's preemption knobs (seconds); `gap` 0 turns preemption off."""

    gap: int = 2
    min_runtime_s: float = 30.0
    reservation_s: float = 60.0
    stale_s: float = 30.0  # a worker's heartbeat older than this: not live
    scan_interval_s: float = 1.0  # the full look at workers and leases, at most this often


class ReservationHint:
    """Whether a reservation may exist in the file (one per Coordinator): while `maybe`
    is False the claim does not look (`reserved_claim`). Raised at start, by `preempt`
    before it inserts, and by the writer whenever a batch or an op rolls back or another
    connection wrote (coordd.job_changes); lowered only when a look finds the table empty.
    """

    def __init__(self) -> None:
        self.maybe = True

    def may_exist(self) -> None:
        """A reservation may exist (or may have come back)."""
        self.maybe = True


class Preemptor:
    """`preempt` on every heartbeat, its full look at workers and leases at most once per
    `scan_interval_s` of coordd time (a backlog with a busy fleet must not cost a scan of
    every lease per heartbeat). `hint` is raised before each reservation it stores."""

    def __init__(self, policy: PreemptPolicy) -> None:
        self.policy = policy
        self.hint = ReservationHint()
        self._last = float("-inf")

    def run(self, conn: sqlite3.Connection, now: float, policies: dict[int, GatePolicy]
            ) -> list[tuple[str, str, str]]:
        """As `preempt`; [] when the last full look was under `scan_interval_s` ago."""
        return preempt(conn, now, policies, self.policy, self, self.hint)

    def due(self, now: float) -> bool:
        """True (and the interval restarts) when a full look may run at `now`."""
        if now - self._last < self.policy.scan_interval_s:
            return False
        self._last = now
        return True


class Held(msgspec.Struct, frozen=True):
    """A running job as the victim choice sees it (times in coordd seconds)."""

    worker_id: str
    job_id: str
    kind: str
    priority: int
    granted_at: float
    checkpoint_at: float  # the last checkpoint of this run, else granted_at
    vacating: bool


def choose_victim(held: list[Held], priority: int, now: float, policy: PreemptPolicy
                  ) -> Held | None:
    """The job to vacate for a waiting job of `priority`: among runs at least `gap` levels
    lower that ran `min_runtime_s`, the lowest priority, then the least work since its last
    checkpoint, then the shortest runtime; None if there is none."""
    fit = [h for h in held if not h.vacating and h.priority >= priority + policy.gap
           and now - h.granted_at >= policy.min_runtime_s]
    if not fit:
        return None
    return min(fit, key=lambda h: (-h.priority, now - h.checkpoint_at, now - h.granted_at,
                                   h.job_id))


def _slots(readings: dict[str, Any]) -> tuple[int | None, dict[str, int]]:
    total = readings.get("slots_total")
    per_kind = readings.get("slots")
    total = total if isinstance(total, int) and not isinstance(total, bool) else None
    kinds = {str(k): v for k, v in per_kind.items() if isinstance(v, int)} \
        if isinstance(per_kind, dict) else {}
    return total, kinds


def _room(total: int | None, kinds: dict[str, int], held: list[Held], reserved: int,
          kind: str, without: Held | None = None, need: Any = None) -> bool:
    """Whether a job of `kind` fits the worker with `held` running (less `without`);
    with `need` ((readings, request, job_id -> grant)), its resources must fit too."""
    runs = [h for h in held if h is not without]
    if total is not None:  # no slots advertised: never counted full by slots
        cap = kinds.get(kind, total)
        if len(runs) + reserved >= total or sum(h.kind == kind for h in runs) >= cap:
            return False
    if need is None:
        return True
    readings, req, grants = need
    books = [grants[h.job_id] for h in held if h.job_id in grants]
    freed = grants.get(without.job_id) if without is not None else None
    return resources.fits_without(readings, req, books, freed)


class Look(msgspec.Struct, kw_only=True):
    """What a preemption scan reads (every store the same rows): waiting candidates
    (job_id, kind, role, priority, gates_json) best first; live workers (worker_id,
    roles_json, heartbeat_json, kinds_json); running jobs by worker; live reservations
    by worker; the candidates' resource requests; job_id -> grant of the leases holding
    something."""

    waiting: list[Any]
    workers: list[Any]
    held: dict[str, list[Held]]
    reserved: dict[str, int]
    needs: dict[str, Any]
    grants: dict[str, Any]


class Preemption(msgspec.Struct, frozen=True):
    """One decided preemption: the waiting job, its priority, the run to vacate."""

    job_id: str
    priority: int
    victim: Held

    @property
    def why(self) -> str:
        """The victim's vacate reason (and its event, after "vacate: ")."""
        return f"preempted_by {self.job_id} (P{self.priority})"

    @property
    def reserved_text(self) -> str:
        """The waiting job's event: where its capacity is reserved."""
        v = self.victim
        return (f"reserved on {v.worker_id}: waits for P{v.priority} job {v.job_id} "
                "to vacate")


def choose(look: Look, policies: dict[int, GatePolicy], policy: PreemptPolicy,
           now: float) -> list[Preemption]:
    """Pure: for each waiting job of `look` that no live worker has room for, the victim
    whose run frees room for it (coordd.preemption.choose_victim), each victim and each
    reserved slot counted once."""
    held = {w: list(hs) for w, hs in look.held.items()}
    reserved = dict(look.reserved)
    done: list[Preemption] = []
    for job_id, kind, role, prio, _gates_json in look.waiting:
        req = look.needs.get(job_id)
        able = []
        for worker_id, roles_json, heartbeat_json, kinds_json in look.workers:
            readings = lenient_json(heartbeat_json, {})
            kinds = lenient_json(kinds_json, None)
            if role not in lenient_json(roles_json, []) or (
                    isinstance(kinds, list) and kind not in kinds):
                continue
            if gates.evaluate(policies[prio], readings if isinstance(readings, dict) else {}):
                continue  # its gates are closed there: room would not help
            readings = readings if isinstance(readings, dict) else {}
            able.append((worker_id, *_slots(readings),
                         None if req is None else (readings, req, look.grants)))
        if not able or any(_room(t, k, held.get(w, []), reserved.get(w, 0), kind, need=n)
                           for w, t, k, n in able):
            continue  # no worker could run it, or one has room and will claim it
        options = [h for w, t, k, n in able for h in held.get(w, [])
                   if _room(t, k, held[w], reserved.get(w, 0), kind, without=h, need=n)]
        victim = choose_victim(options, prio, now, policy)
        if victim is None:
            continue
        held[victim.worker_id] = [msgspec.structs.replace(h, vacating=True)
                                  if h is victim else h for h in held[victim.worker_id]]
        reserved[victim.worker_id] = reserved.get(victim.worker_id, 0) + 1
        done.append(Preemption(job_id=job_id, priority=prio, victim=victim))
    return done


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
                   hint: ReservationHint | None = None) -> str | None:
    """The claim's look at reservations on `worker_id`: the reserved job still waiting, to
    be taken first, or None. Reservations whose job no longer waits are dropped. With a
    `hint` that says none can exist, no look; one that finds none for this worker checks
    whether the table is empty, and if so lowers the hint."""
    if hint is not None and not hint.maybe:
        return None
    for job_id, status in conn.execute(SQL_RESERVED_FOR_WORKER, (worker_id, now)).fetchall():
        if status == "waiting":
            return job_id
        conn.execute(SQL_DELETE_RESERVATION, (job_id,))
    if hint is not None and conn.execute(SQL_ANY_RESERVATION).fetchone() is None:
        hint.maybe = False
    return None
