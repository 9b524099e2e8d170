"""PostgresStore's admission part (coordd.store.api_admission): the limits a job names,
a `complete` judged in Python (a result schema, reported usage against budgets), the
runtime overrides and the `limits` views. The claim's side is
coordd.store.postgres.admission.

A job with a `result_schema` and a workflow node never match the batched complete
(sql.SQL_COMPLETE_BATCH); they are completed here, with coordd.rules.transitions.complete
deciding, in one transaction that ends the lease, writes the decision and settles a
node's workflow, as `fail` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from coordd import errors
from coordd.rules import transitions as tr
from coordd.rules.limits import LimitBook, limit_view
from coordd.wire.protocol import CompleteResult
from coordd.wire.limits import LimitView
from coordd.store import NewJob
from coordd.store.api import Backoff, LeaseRef
from coordd.store.api_artifacts import not_held
from coordd.store.postgres import admission, apply, fence, sql, workflows
from coordd.store.postgres.sql import NOW

SQL_ATTACH = (  # $1 job ids, $2 names, $3 units
    "INSERT INTO job_limits (job_id, name, units) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::int[])"
)
SQL_ANY_GATED = ("SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('waiting', 'blocked') "
                 "AND gates_json IS NOT NULL)")
SQL_SUCCEED = (  # $2 job, $3 result JSON
    "UPDATE jobs SET status = 'succeeded', result_json = $3, artifact_sha256 = NULL, "
    "last_error = NULL, "
    f"cancel_requested = false, updated_at = {NOW}, finished_at = {NOW} WHERE job_id = $2"
)
SQL_SET_ARTIFACT = "UPDATE jobs SET artifact_sha256 = $2 WHERE job_id = $1"
SQL_STORED_SIZE = "SELECT size FROM artifacts WHERE sha256 = $1"
SQL_RECORD_USAGE = (  # $2 job, $3 metrics, $4 amounts; $5, $6: (limit, metric) with a budget
    f"INSERT INTO limit_usage (name, metric, at, amount) SELECT jl.name, u.metric, {NOW}, "
    "u.amount FROM job_limits jl CROSS JOIN unnest($3::text[], $4::float8[]) AS u(metric, amount) "
    "WHERE jl.job_id = $2 AND u.amount > 0 AND EXISTS (SELECT 1 FROM unnest($5::text[], "
    "$6::text[]) AS b(name, metric) WHERE b.name = jl.name AND b.metric = u.metric)"
)
SQL_JOB_LIMITS = "SELECT name, units FROM job_limits WHERE job_id = $1 ORDER BY name"
SQL_OVERRIDES = "SELECT name, settings_json FROM limit_overrides ORDER BY name"
SQL_SET_OVERRIDE = (
    f"INSERT INTO limit_overrides (name, settings_json, updated_at) VALUES ($2, $3, {NOW}) "
    "ON CONFLICT (name) DO UPDATE SET settings_json = excluded.settings_json, "
    "updated_at = excluded.updated_at"
)
SQL_DROP_OVERRIDE = "DELETE FROM limit_overrides WHERE name = $1"
SQL_DROP_CLAIMS = "DELETE FROM limit_claims WHERE name = $1"
SQL_VIEW = (  # $2 name, $3 rate window (0: none): held, rate used, waiting naming it, now
    "SELECT (SELECT coalesce(sum(units), 0)::int FROM limit_holds WHERE name = $2), "
    f"CASE WHEN $3::float8 > 0 THEN (SELECT coalesce(sum(units), 0)::int FROM limit_claims "
    f"WHERE name = $2 AND at > {NOW} - $3::float8) ELSE 0 END, "
    "(SELECT count(*)::int FROM job_limits jl JOIN jobs j ON j.job_id = jl.job_id "
    f"WHERE jl.name = $2 AND j.status = 'waiting'), {NOW}"
)
SQL_HOLDERS = (
    "SELECT job_id, worker_id, priority, units, since FROM limit_holds WHERE name = $1 "
    "ORDER BY since, job_id"
)
SQL_USAGE_IN = ("SELECT coalesce(sum(amount), 0)::float8 FROM limit_usage WHERE name = $2 "
                f"AND metric = $3 AND at > {NOW} - $4::float8")
SQL_WINDOW_FREES = (
    "SELECT at + $3::float8 FROM (SELECT at, sum(units) OVER (ORDER BY at ROWS UNBOUNDED "
    f"PRECEDING) AS run FROM limit_claims WHERE name = $2 AND at > {NOW} - $3::float8) w "
    "WHERE run >= $4 ORDER BY at LIMIT 1"
)


def _no_backoff(_attempts: int) -> float:
    return 0.0


async def attach(conn: Any, jobs: Sequence[NewJob]) -> None:
    """Record the limits the new `jobs` consume (in the enqueue's transaction)."""
    rows = [(j.job_id, n, u) for j in jobs for n, u in j.limits]
    if rows:
        await conn.execute(SQL_ATTACH, *[list(c) for c in zip(*rows)])


async def complete_checked(conn: Any, now: float | None, ref: LeaseRef,
                           result_json: str | None, backoff: Backoff,
                           artifact: Any = None) -> CompleteResult:
    """A fenced complete decided by coordd.rules.transitions.complete (result schema, a requested
    cancel), in the caller's transaction; a workflow node's workflow is locked first and
    settled after (coordd.store.postgres.workflows' lock order). `artifact` (an
    ArtifactRef): the result's file, stored already by `artifact_put`. Raises: the fencing
    errors; errors.BadRequest (the artifact is not in the store, or has another size)."""
    wid = await workflows.lock_of_job(conn, ref.job_id)
    held, t = await fence.end_lease(conn, now, ref)
    d = tr.complete(held, t, result_json, artifact is not None, backoff)
    if d.t is tr.COMPLETED:
        await conn.execute(SQL_SUCCEED, now, ref.job_id, d.result_json)
        if artifact is not None:
            await _record_artifact(conn, ref.job_id, artifact)
        await conn.execute(sql.SQL_EVENT, now, ref.job_id, ref.worker_id, d.t.from_status,
                           d.t.to_status, d.reason)
    elif d.t is tr.INVALID_RETRY:
        await conn.execute(sql.SQL_TO_WAITING, now, ref.job_id, d.last_error, d.run_at)
        await conn.execute(sql.SQL_EVENT, now, ref.job_id, ref.worker_id, d.t.from_status,
                           d.t.to_status, d.reason)
    elif d.t is tr.INVALID_FAILED:
        await conn.execute(sql.SQL_TO_TERMINAL, now, ref.job_id, d.t.to_status, d.last_error)
        await conn.execute(sql.SQL_EVENT, now, ref.job_id, ref.worker_id, d.t.from_status,
                           d.t.to_status, d.reason)
    else:
        await apply.apply(conn, now, ref.job_id, ref.worker_id, d)
    if d.settle:
        await workflows.settle(conn, now, wid)
    return CompleteResult(status=d.t.to_status, error=d.invalid)


async def _record_artifact(conn: Any, job_id: str, artifact: Any) -> None:
    """Point the job at its result artifact. The coordinator checked that the store holds
    it (coordd.service.transfers); checked again here, in the transaction, for one swept
    since (the job's row would name a row that is gone)."""
    size = await conn.fetchval(SQL_STORED_SIZE, artifact.sha256)
    if size != artifact.size:
        raise errors.BadRequest(not_held(artifact.sha256, artifact.size))
    await conn.execute(SQL_SET_ARTIFACT, job_id, artifact.sha256)


class PostgresAdmission:
    """Mixed into PostgresStore (uses its `_conn`); `backoff_factory` gives the backoff a
    result failing its schema waits (the coordinator sets it; none: at once)."""

    _conn: Any
    backoff_factory: Any = None

    def _result_backoff(self) -> Backoff:
        return self.backoff_factory() if self.backoff_factory is not None else _no_backoff

    async def attach_limits(self, conn: Any, jobs: Sequence[Any]) -> None:
        """`attach` for new jobs or workflow nodes (in their insert's transaction)."""
        await attach(conn, jobs)

    async def _gated_waiting(self) -> bool:
        """Whether a waiting (or blocked: a workflow node) job has its own gates (claims
        then take the admission path)."""
        async with self._conn() as conn:
            return bool(await conn.fetchval(SQL_ANY_GATED))

    async def complete_counted(self, ref: LeaseRef, result_json: str | None,
                               usage: dict[str, float] | None, book: LimitBook,
                               backoff: Backoff, *, artifact: Any = None,
                               now: float | None = None, then: Any = None) -> CompleteResult:
        """complete with reported usage in one transaction; `then` is not run here (limits
        are in play: `next` None, the Coordinator claims after the report)."""
        budgets = [(n, m) for n, d in book.defs.items() for m in d.budget]
        async with self._conn() as conn, conn.transaction():
            res = await complete_checked(conn, now, ref, result_json, backoff, artifact)
            if usage and budgets:
                metrics = list(usage)
                await conn.execute(SQL_RECORD_USAGE, now, ref.job_id, metrics,
                                   [float(usage[m]) for m in metrics],
                                   [n for n, _ in budgets], [m for _, m in budgets])
        return res

    async def limit_overrides(self) -> list[tuple[str, dict[str, Any]]]:
        async with self._conn() as conn:
            rows = await conn.fetch(SQL_OVERRIDES)
        out = []
        for name, text in rows:
            try:
                settings = msgspec.json.decode(text)
            except msgspec.DecodeError:
                continue
            if isinstance(settings, dict):
                out.append((name, settings))
        return out

    async def set_limit_override(self, name: str, settings: dict[str, Any] | None,
                                 rate_dropped: bool, *, now: float | None = None) -> None:
        async with self._conn() as conn, conn.transaction():
            if settings is None:
                await conn.execute(SQL_DROP_OVERRIDE, name)
            else:
                await conn.execute(SQL_SET_OVERRIDE, now, name,
                                   msgspec.json.encode(settings).decode())
            if rate_dropped:
                await conn.execute(SQL_DROP_CLAIMS, name)

    async def job_limits(self, job_id: str, priority: int, waiting: bool, book: LimitBook,
                         *, now: float | None = None) -> tuple[list[tuple[str, int]], str | None]:
        async with self._conn() as conn:
            uses = [(n, u) for n, u in await conn.fetch(SQL_JOB_LIMITS, job_id)]
            if not (uses and waiting and book.active):
                return uses, None
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                t = await conn.fetchval(sql.SQL_NOW, now)
                why, _ = await admission.limit_detail(admission.Readings(conn, now, prune=False),
                                                      book, uses, priority, t)
        return uses, why

    async def limit_views(self, book: LimitBook, names: list[str], holders: bool, *,
                          now: float | None = None) -> tuple[list[LimitView], float]:
        out, t = [], now
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read",
                                                          readonly=True):
            for name in names:
                limit = book.defs[name]
                window = limit.rate_window_s if limit.rate_n else 0.0
                used, rate_used, waiting, t = await conn.fetchrow(SQL_VIEW, now, name, window)
                frees = None
                if limit.rate_n and rate_used >= limit.rate_n:
                    frees = await conn.fetchval(SQL_WINDOW_FREES, now, name, window,
                                                rate_used - limit.rate_n + 1)
                budget_used = {m: await conn.fetchval(SQL_USAGE_IN, now, name, m, b[1])
                               for m, b in limit.budget.items()}
                who = [tuple(r) for r in await conn.fetch(SQL_HOLDERS, name)] if holders else []
                out.append(limit_view(limit, t, used, rate_used, frees, budget_used, waiting,
                                      who))
            if t is None:
                t = await conn.fetchval(sql.SQL_NOW, now)
        return out, t
