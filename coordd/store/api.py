"""The store interface: coordd's operations on jobs, leases and workers, one level above SQL.

Like River's `riverdriver.Executor`: each store carries its own statements, and one
conformance suite (tests/store/) holds both to the same rules. Every write takes `now`:
None in production (the store's clock: coordd's for SQLite, the database's `now()` for
PostgreSQL), a pinned Unix time in tests. Errors are the coordd.errors classes, raised in
the same situations by every store; results are the protocol Structs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from coordd.wire.protocol import (
    ClaimResult, CompleteResult, EnqueueResult, HeartbeatResult, JobList, JobView,
    RenewResult, StatusResult,
)

if TYPE_CHECKING:
    from coordd.rules.claim_batch import NextClaim
    from coordd.rules.claim_policy import ClaimPolicy

Backoff = Callable[[int], float]  # attempts so far -> seconds before the retry


class NewJob(msgspec.Struct, kw_only=True):
    """A validated job ready to insert, what `Store.enqueue` takes (sizes already checked,
    JSON already encoded)."""

    job_id: str
    kind: str
    required_role: str
    priority: int
    payload_json: str
    run_at: float | None
    max_attempts: int
    idempotency_key: str | None
    max_runtime_s: float | None
    gates_json: str | None
    result_schema: str | None = None
    delay_s: float | None = None  # run_at is then now + delay_s (coordd's clock)
    request_sha256: str | None = None  # with an idempotency key: the request's hash
    resources: Any = None  # a coordd.rules.resources.Request (stored in coordd.store.resources)
    limits: list[tuple[str, int]] = []  # fleet-wide limits it consumes (name, units)


class LeaseRef(msgspec.Struct, frozen=True):
    """The lease a holder call presents: (job, worker, fencing token)."""

    job_id: str
    worker_id: str
    token: int


class JobFilter(msgspec.Struct, kw_only=True):
    """`list_jobs` filters and its keyset page (`after`: the last job id of the page before)."""

    status: str | None = None
    kind: str | None = None
    role: str | None = None
    priority: int | None = None
    limit: int = 100
    after: str | None = None
    newest_first: bool = False


class StoreStatus(msgspec.Struct, kw_only=True):
    """What `status` counts: workers (all, live), live leases, jobs by status (every status,
    zero where none), waiting jobs by priority ("p0".."p3")."""

    workers: int
    workers_live: int
    active_leases: int
    jobs: dict[str, int]
    waiting_by_priority: dict[str, int]
    oldest_waiting_age_s: float | None = None
    prunable: int = 0  # terminal jobs finished before `prune_before`, counted up to a cap
    db_bytes: int = 0  # SQLite: the database file; PostgreSQL: pg_database_size
    wal_bytes: int = 0
    queue_depth: int = 0  # writes queued in the store (SQLite's single writer)
    warnings: list[str] = []  # the store's own (SQLite: the disk refused writes)


class StoreHooks(msgspec.Struct, kw_only=True):
    """What the coordinator hands its store once (`Store.attach`): its claim policy (a
    store may add hints to it), preemption's reservation hint, the parked calls to wake
    (coordd.service.push.Push), its metrics and its backoff factory (each call draws one backoff
    function: a result failing its schema, a failure, wait after it). `peers`: how many
    peers may add requests at once (the daemon's rpc.Dispatcher.peers; None outside a
    daemon); a store that group-commits stops waiting for more once each has one."""

    policy: Any
    reservations: Any
    push: Any
    meters: Any
    backoff: Any
    peers: Callable[[], int] | None = None


class Leader(Protocol):
    """The coordinator's leadership, held by the serving daemon (`Store.leader`)."""

    async def try_acquire(self) -> bool: ...
    async def acquire(self) -> None: ...
    async def watch(self) -> str:
        """Return (a reason) when the held leadership is lost; never while it holds."""
        ...
    async def close(self) -> None: ...


class Store(Protocol):
    """coordd's operations over one database (see the module docstring).

    The holder calls (`renew`, `checkpoint`, `complete`, `fail`, `release`) are fenced:
    refused unless `ref` is the job's current lease and `now < expires_at`, reaped or not.

    Raises (every store, the same situations):
        errors.NotFound: no such job.
        errors.LeaseLost: the lease is not the job's current one (or ran past max runtime).
        errors.LeaseExpired: it is, but its time is up.
        errors.AlreadyCompleted: the job succeeded under this very lease (a resend).
        errors.InvalidState: cancel/retry/enqueue refused by the job's state.
        errors.BadRequest: what this store cannot store (see each store).
        errors.Overloaded, errors.Unavailable: the store cannot take the write now.
    """

    clock: Literal["app", "db"]  # who supplies `now` in production
    name: str  # "SQLite", "PostgreSQL": for messages
    noun: str  # what coordd says it cannot open: "the database", "the store"

    def hold(self, given: str | None = None) -> AbstractContextManager[None]:
        """Hold what keeps a second coordd off this store while the daemon runs, entered
        before `start` (SQLite: the file's lock, `given` its path as configured;
        PostgreSQL: nothing, `leader` decides). Raises: errors.InvalidState."""
        ...

    async def wait_dead(self, stop: Any) -> None:
        """Return when the store can no longer serve (raising why), or at `stop`."""
        ...

    async def ping(self) -> None:
        """One empty write (SQLite) or round trip (PostgreSQL): the watchdog's proof."""
        ...

    def attach(self, hooks: StoreHooks) -> None:
        """Take the coordinator's hooks, before `start` (wake-ups of parked calls: SQLite
        from its writer's commits, PostgreSQL from LISTEN and a poll)."""
        ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...

    async def heartbeat(self, worker_id: str, roles: Sequence[str], readings: dict[str, Any],
                        *, now: float | None = None) -> HeartbeatResult: ...
    async def enqueue(self, jobs: Sequence[NewJob], *, indexed: bool = False,
                      now: float | None = None) -> list[EnqueueResult]:
        """All or none; `indexed`: an error's message names the job (`jobs[3]: ...`)."""
        ...

    async def claim(self, worker_id: str, lease_s: float, policy: ClaimPolicy, *,
                    kinds: Sequence[str] | None = None, claim_id: str | None = None,
                    now: float | None = None) -> ClaimResult: ...
    async def renew(self, ref: LeaseRef, lease_s: float, *,
                    now: float | None = None) -> RenewResult: ...
    async def checkpoint(self, ref: LeaseRef, checkpoint_json: str, *,
                         now: float | None = None) -> None: ...
    async def complete(self, ref: LeaseRef, result_json: str | None, *,
                       artifact: Any = None, now: float | None = None,
                       then: NextClaim | None = None) -> CompleteResult:
        """Store the result once (a result failing the job's schema spends the attempt
        after the attached backoff); `artifact` (SQLite: a stored artifact's reference).
        `then` (on complete, complete_counted, fail and release): the worker's next claim,
        decided by the Coordinator, run in the report's own write, its result in `next`;
        a store that cannot run it there leaves `next` None and the Coordinator claims
        after the report (PostgreSQL, for a claim of several jobs)."""
        ...
    async def fail(self, ref: LeaseRef, error: str, retryable: bool, backoff: Backoff, *,
                   now: float | None = None, then: NextClaim | None = None
                   ) -> StatusResult: ...
    async def release(self, ref: LeaseRef, reason: str, checkpoint_json: str | None = None,
                      *, now: float | None = None, then: NextClaim | None = None
                      ) -> StatusResult: ...
    async def reap(self, *, limit: int = 1000, now: float | None = None) -> int: ...
    async def cancel(self, job_id: str, *, now: float | None = None) -> StatusResult: ...
    async def retry(self, job_id: str, *, now: float | None = None) -> StatusResult: ...

    async def get_job(self, job_id: str, *, now: float | None = None) -> JobView: ...
    async def list_jobs(self, flt: JobFilter, *, now: float | None = None) -> JobList: ...
    async def status(self, stale_s: float, *, prune_before: float | None = None,
                     now: float | None = None) -> StoreStatus: ...
    async def restart_grace(self, *, now: float | None = None) -> int:
        """Give every stored lease at least one more `lease_s` from now; return how many."""
        ...
    async def resolve_id(self, what: str, given: str) -> str:
        """The "job" or "workflow" id `given` is, or (SQLite) the one it is the start of.
        Raises: errors.NotFound, errors.BadRequest (empty; an ambiguous prefix)."""
        ...
    async def oldest_waiting(self, levels: Sequence[int], per_level: int, *,
                             now: float | None = None) -> tuple[float, list[Any]]:
        """(now, [(ready time, view)]): the `per_level` oldest due waiting jobs of each
        priority in `levels` (coordd.service.waiting_report)."""
        ...

    async def wait_for_work(self, timeout: float) -> bool:
        """Return True when a job may have become claimable (a hint), False at `timeout`."""
        ...

    def leader(self, key: str, session_timeout_s: float) -> Leader:
        """The serving daemon's leadership (SQLite: always won, never lost: one file has
        one writer and coordd holds its lock; PostgreSQL: a session advisory lock, a
        standby waits in `acquire`)."""
        ...

    def leadership(self, key: str = ..., on_lost: Callable[[], None] | None = ...
                   ) -> AbstractAsyncContextManager[bool]:
        """Hold the coordinator's leadership while the block runs; yields whether it was
        won (SQLite: always, the file has one writer; PostgreSQL: a session advisory lock).
        `on_lost()` is called if a won leadership ends before the block does (stop
        serving: another coordd may lead now)."""
        ...


__all__ = ["Backoff", "JobFilter", "LeaseRef", "Leader", "Store", "StoreHooks", "StoreStatus"]
