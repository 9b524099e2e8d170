"""Priority preemption: a waiting job that no worker has room for takes the place of a
running job at least `preempt_gap` priorities lower, and the capacity it frees is
reserved for it.

Everything here is pure (`choose` decides); SQLite's `preempt` runs it inside the writer's
transaction on each heartbeat (coordd.store.sqlite.preemption_ops; PostgreSQL's is
coordd.store.postgres.governance): it marks the victim's lease `vacate` (coordd.rules.governance
then tells its holder on every heartbeat and renew until `release`) and inserts a reservation,
so the claim of that worker takes the waiting job first (`reserved_claim`) until the reservation
lapses after `reservation_s`. A worker's room comes from the `slots_total` / `slots` readings it
sends; a worker that sends none is never counted full, so it never loses a job here. The claim
skips its look at reservations while `ReservationHint` says none can exist; the rule not to
break: the hint is raised before any reservation can be stored or come back (an insert here, a
rollback, another connection's write) and lowered only by a look that found the table empty.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.rules import gates
from coordd.rules import resources
from coordd.rules.gates import GatePolicy
from coordd.jsontext import lenient_json

CANDIDATES_MAX = 16  # waiting jobs looked at per scan, best first


class PreemptPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The config's preemption knobs (seconds); `gap` 0 turns preemption off."""

    gap: int = 2
    min_runtime_s: float = 30.0
    reservation_s: float = 60.0
    stale_s: float = 30.0  # a worker's heartbeat older than this: not live
    scan_interval_s: float = 1.0  # the full look at workers and leases, at most this often


class ReservationHint:
    """Whether a reservation may exist in the file (one per Coordinator): while `maybe` is False
    the claim does not look (`reserved_claim`). Raised at start, by `preempt` before it inserts,
    and by the writer whenever a batch or an op rolls back or another connection wrote
    (coordd.store.sqlite.job_changes); lowered only when a look finds the table empty.
    """

    def __init__(self) -> None:
        self.maybe = True

    def may_exist(self) -> None:
        """A reservation may exist (or may have come back)."""
        self.maybe = True


class Preemptor:
    """The pace of preemption on every heartbeat (each store's walk asks `due`): its full look
    at workers and leases at most once per `scan_interval_s` of coordd time (a backlog with a
    busy fleet must not cost a scan of every lease per heartbeat). `hint` is raised before each
    reservation it stores."""

    def __init__(self, policy: PreemptPolicy) -> None:
        self.policy = policy
        self.hint = ReservationHint()
        self._last = float("-inf")

    looks = 0  # calls of `due`: each store asks only while a job that may preempt waits

    def due(self, now: float) -> bool:
        """True (and the interval restarts) when a full look may run at `now`."""
        self.looks += 1
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
    whose run frees room for it (coordd.rules.preemption.choose_victim), each victim and each
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
