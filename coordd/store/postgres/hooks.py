"""PostgresStore's part of serving one coordinator (coordd.store.api: `attach`, `leader`)
and the reads the coordinator's explanations take (`explain_book`, `limit_reasons`,
`job_node`).

Parked claims are woken as on SQLite (coordd.service.push): a job entering `waiting` gives
one wake credit to a parked claim that may take its role and kind (its trigger's NOTIFY
names them, coordd.store.postgres.push_sql, whoever wrote the job: a standby's claims wake
too); a run_at ahead goes on push's timer; a limit's units freed wake the claims a limit
refused; a heartbeat stored here wakes that worker's gated claims (`beat_stored`). Since
a NOTIFY is only a hint, every parked claim also looks again when a LISTEN session opens
or ends (the first one too: nothing was heard before it) and every POLL_S while no session
can be opened; every SAFETY_S one statement reads the jobs due by role and kind and
gives their wake credits again (an idle fleet: one read, no claim looks).

The other parked calls are woken by the NOTIFYs of coordd.store.postgres.push_sql's
triggers (coordd.service.push.Push.store_note), each by the one that concerns it; a
listening session lost or never opened wakes them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from coordd.clock import SystemClock
from coordd.store.api import StoreHooks
from coordd.store.api_governance import ExplainBook
from coordd.store.postgres.leader import Leadership
from coordd.store.postgres.push_sql import US
from coordd.store.postgres.sql import NOW
from coordd.store.postgres.resources import books, requests_of

logger = logging.getLogger(__name__)
_WALL = SystemClock()  # a run_at ahead: the database's delay from coordd's wall clock

POLL_S = 1.0  # parked claims look again this often while no LISTEN session opens
SAFETY_S = 30.0  # ... and this often while one listens (a NOTIFY is only a hint)
SQL_DUE_BY_ROLE = (  # $2: counted up to this many per role and kind
    "SELECT required_role, kind, least(count(*), $2) FROM jobs WHERE status = 'waiting' "
    f"AND run_at <= {NOW} GROUP BY required_role, kind"
)
SQL_JOB_NODE = "SELECT workflow_id, node, result_schema FROM jobs WHERE job_id = $1"
SQL_JOB_DEPS = (  # in the dependencies' order (SQLite: the dependency's rowid, its enqueue)
    "SELECT d.node, d.status, e.policy FROM workflow_edges e JOIN jobs d "
    "ON d.job_id = e.dep_job_id WHERE e.job_id = $1 ORDER BY d.job_id"
)


class PostgresServing:
    """Mixed into PostgresStore (its `_conn`, `dsn`, `_listener`, `worker_book`,
    `job_limits`, `scheduled_jobs`)."""

    _conn: Any
    _listener: Any
    dsn: str
    scheduled_jobs: Any
    worker_book: Any
    job_limits: Any
    backoff_factory: Any
    _hooks: StoreHooks | None = None
    _pump: asyncio.Task[None] | None = None
    _flush: asyncio.Handle | None = None

    noun = "the store"  # what coordd says it cannot open
    """The word for a method of an area not served here, where it is not "not yet"."""

    @contextlib.contextmanager
    def hold(self, given: str | None = None) -> Iterator[None]:
        """Nothing to hold: leadership (`leader`) keeps two coordds from serving."""
        yield

    async def wait_dead(self, stop: asyncio.Event) -> None:
        """Nothing to watch beyond leadership: wait for `stop`."""
        await stop.wait()

    def attach(self, hooks: StoreHooks) -> None:
        """Take the coordinator's hooks: its backoff (a result failing its schema) and
        the parked claims `start` begins to wake."""
        self._hooks = hooks
        self.backoff_factory = hooks.backoff
        self._listener.on_push = hooks.push.store_note
        self._listener.on_work = self._work_heard

    async def start_wakeups(self) -> None:
        """Start waking the parked claims (with hooks attached; at `start`): push's run_at
        timer with the jobs scheduled now, and the listening session's keeper."""
        if self._hooks is not None and self._pump is None:
            due = await self.scheduled_jobs()  # no clock step is told here (SQLite only)
            self._hooks.push.start(lambda now: [d for d in due if d[0] > now])
            self._pump = asyncio.create_task(self._pump_wakeups(self._hooks.push),
                                             name="store-wakeups")

    def _work_heard(self, payload: str) -> None:
        """One coordd_work NOTIFY (push_sql's payloads) noted for push; the notes of one
        burst are dispatched together, as a commit's are on SQLite."""
        push = self._hooks.push if self._hooks is not None else None
        if push is None:
            return
        what, rest = payload[:1], payload[1:]
        fields = rest.split(US, 3)
        if what == "w" and len(fields) == 4:
            role, kind, ahead, job_id = fields
            push.job_waiting(job_id, role, kind,
                             _WALL.wall() + float(ahead) if ahead else None)
            if self._flush is None:
                self._flush = asyncio.get_running_loop().call_soon(self._committed, push)
        elif what == "l":
            push.limits_changed()
        else:  # an old-style hint (empty), or one this coordd does not know: all look
            push.wake_claims()

    def _committed(self, push: Any) -> None:
        self._flush = None
        push.committed()

    def beat_stored(self, worker_id: str, roles: Sequence[str]) -> None:
        """A heartbeat committed (after its transaction): that worker's parked claims
        refused by gates look again, and its roles pick the claims a job wakes."""
        if self._hooks is not None:
            self._hooks.push.heartbeat(worker_id, frozenset(roles))

    async def stop_wakeups(self) -> None:
        """Stop waking them (at `close`). Idempotent."""
        if self._pump is not None:
            pump, self._pump = self._pump, None
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)

    async def _pump_wakeups(self, push: Any) -> None:
        """Keep the LISTEN session. Every parked claim looks again when one opens or ends
        (NOTIFYs may have gone unheard) and every POLL_S while none opens; every SAFETY_S
        the safety look wakes claims for the jobs due then (`_safety_look`)."""
        while True:
            try:
                why = await self._listener.keep(SAFETY_S, POLL_S)
                if why == "timeout":
                    await self._safety_look(push)
                    continue
            except Exception as exc:  # the listener or the look failed: poll meanwhile
                logger.warning("store wake-ups: %s (parked claims poll)", exc,
                               extra={"action": "wakeups_failed"})
                await asyncio.sleep(POLL_S)
            push.wake_claims()

    async def _safety_look(self, push: Any) -> None:
        """One statement: the waiting jobs due now, by role and kind, each a wake credit
        (as their NOTIFYs would have given), so an idle fleet costs one read per SAFETY_S,
        not a look by every parked claim."""
        if not push.parked:
            return
        async with self._conn() as conn:
            rows = await conn.fetch(SQL_DUE_BY_ROLE, None, push.parked)
        for role, kind, n in rows:
            push.job_ready(role, kind, n)

    async def ping(self) -> None:
        """One round trip on a pool connection. Raises: errors.Unavailable, Overloaded."""
        async with self._conn() as conn:
            await conn.fetchval("SELECT 1")

    def leader(self, key: str = "coordd", session_timeout_s: float = 0.0) -> Leadership:
        """The coordinator's session advisory lock on a connection of its own
        (coordd.store.postgres.leader); a standby waits in `acquire`."""
        return Leadership(self.dsn, key, session_timeout_s)

    async def job_node(self, job_id: str) -> tuple[str | None, str | None, str | None,
                                                   list[tuple[str, str, str]]]:
        async with self._conn() as conn:
            row = await conn.fetchrow(SQL_JOB_NODE, job_id)
            if row is None or row[0] is None:
                return None, None, None, []
            deps = [tuple(r) for r in await conn.fetch(SQL_JOB_DEPS, job_id)]
        return row[0], row[1], row[2], deps  # type: ignore[return-value]

    async def explain_book(self, *, now: float | None = None) -> ExplainBook:
        book = await self.worker_book(now=now)
        return ExplainBook(now=book.now, rows=book.rows, states=book.states)

    async def resource_book(self, job_ids: Sequence[str]
                            ) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        if not job_ids:
            return {}, {}
        async with self._conn() as conn:
            requests = await requests_of(conn, list(job_ids))
            grants = (await books(conn))[0] if requests else {}
        return requests, grants

    async def limits_loaded(self, book: Any) -> None:
        """Nothing to settle: the statements judge limits whether or not any is defined."""

    async def limit_reasons(self, waiting: list[tuple[str, int]], book: Any, *,
                            now: float | None = None) -> dict[str, str]:
        out: dict[str, str] = {}
        if not book.active:
            return out
        for job_id, priority in waiting:
            _, why = await self.job_limits(job_id, priority, True, book, now=now)
            if why is not None:
                out[job_id] = why
        return out


__all__ = ["POLL_S", "SAFETY_S", "PostgresServing"]
