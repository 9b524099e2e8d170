"""The Coordinator's reads: `status`, `metrics`, `get_job`, `list_jobs`, `workers`,
`workflow_get`, and why a waiting job is not running (coordd.rules.explain, coordd.rules.resources,
fleet-wide limits), decided here for both stores from what the store reads."""

from __future__ import annotations

from typing import Any

import msgspec

from coordd import errors
from coordd.net import budgets
from coordd.rules import explain
from coordd.net import fdlimit
from coordd.service import governor
from coordd.service import limits as limit_service
from coordd.rules import resources
from coordd.store import views
from coordd.service import waiting_report
from coordd.wire.protocol import (
    JOB_STATUSES, PRIORITIES, Empty, GetJob, JobId, JobList, JobView, ListJobs, MetricsResult,
    StatusReply, WorkersResult,
)
from coordd.wire.limits import LimitsQuery, LimitUse
from coordd.wire.workflows import WorkflowId, WorkflowView
from coordd.service.checks import LIST_LIMIT_MAX
from coordd.rules.names import check_id
from coordd.store.api import JobFilter
from coordd.rules.worker_list import worker_views


class Reads:
    """Mixed into Coordinator (its store, config, clock, policies, limit book, meters,
    local seam)."""

    store: Any
    config: Any
    clock: Any
    meters: Any
    local: Any
    limit_book: Any
    artifact_bytes: int
    _policies: Any
    _status: Any
    _queue_depth: int
    limits: Any

    async def status(self, p: Empty | None = None) -> StatusReply:
        """Counts of workers, live leases and jobs by status (every status, zero where none),
        the store's sizes and warnings.

        Callers that ask while a status read runs share the next one
        (coordd.service.coalesced.Coalesced): still read after they asked, at a fraction of
        the reads.
        Raises: errors.Overloaded (the read queue is full).
        """
        return await self._status()  # type: ignore[no-any-return]

    async def _status_now(self) -> StatusReply:
        now = self.clock.wall()
        cfg = self.config
        st = await self.store.status(cfg.heartbeat_stale_s, prune_before=now - cfg.retention_s)
        self._queue_depth = st.queue_depth
        warnings = []
        if st.db_bytes > cfg.warn_db_bytes:
            warnings.append(f"database is {st.db_bytes} bytes (> warn_db_bytes "
                            f"{cfg.warn_db_bytes}); "
                            f"{'at least ' if st.prunable >= views.PRUNABLE_COUNTED_MAX else ''}"
                            f"{st.prunable} job(s) can be pruned")
        if self.artifact_bytes > cfg.warn_artifact_bytes:
            warnings.append(f"artifact store is {self.artifact_bytes} bytes (> "
                            f"warn_artifact_bytes {cfg.warn_artifact_bytes})")
        if st.wal_bytes > cfg.warn_wal_bytes:
            warnings.append(f"WAL is {st.wal_bytes} bytes (> warn_wal_bytes "
                            f"{cfg.warn_wal_bytes}): is a long read pinning it?")
        warnings += [*st.warnings, *[w for w in (fdlimit.warning(),) if w]]
        heads, late = await waiting_report.on_store(  # the oldest waiting, a late P0
            self.store, st.waiting_by_priority, self._policies, cfg.heartbeat_stale_s,
            cfg.warn_p0_wait_s, explain_waiting=self.explain_waiting)
        return StatusReply(workers=st.workers, workers_live=st.workers_live,
                           active_leases=st.active_leases, jobs=st.jobs,
                           waiting_by_priority=st.waiting_by_priority, db_bytes=st.db_bytes,
                           wal_bytes=st.wal_bytes, oldest_waiting_age_s=st.oldest_waiting_age_s,
                           now=now, prunable=st.prunable, warnings=warnings + late,
                           waiting=heads)

    async def metrics(self, p: Empty | None = None) -> MetricsResult:
        """Refresh the gauges (a `status` read, the store's write queue, the artifact
        store's size) and return every series in Prometheus text format."""
        st = await self.status()
        self.artifact_bytes = await self.store.artifact_bytes()
        self.meters.set_status(st, self._queue_depth, self.artifact_bytes)
        self.meters.set_limits((await self.limits(LimitsQuery(holders=False))).limits)
        return MetricsResult(text=self.meters.render())

    async def get_job(self, p: GetJob | JobId) -> JobView:
        """One job with lease, events, its workflow node, governance and limits and, if
        waiting, why it is not running; with `p.prefix`, the one job whose id starts with
        `p.job_id` (where the store looks ids up by prefix).

        Raises: NotFound, BadRequest (an ambiguous prefix: a few matches are named).
        """
        now = self.clock.wall()
        prefix = getattr(p, "prefix", False)  # a plain JobId (in-process callers): exact
        check_id("job_id", p.job_id)
        job_id = await self.store.resolve_id("job", p.job_id) if prefix else p.job_id
        if budgets.reply_budgeted():  # the reply's bytes reserved before it is read
            await budgets.reserve_reply(await self.store.job_reply_bytes(job_id))
        job: JobView = await self.store.get_job(job_id)
        job.workflow_id, job.node, job.result_schema, deps = await self.store.job_node(job_id)
        g = await self.store.job_governance(job_id)
        job.preemptions = g.preemptions
        job.resources = None if g.request is None else msgspec.structs.asdict(g.request)
        if job.lease is not None:
            job.lease.governance = g.suspension  # suspended since, vacate reason
            job.granted = governor.granted_view(g.grant)
        if job.status == "waiting":
            why = governor.reserved_reason(g.reservation, None)  # the store found it live
            if why is not None:
                job.waiting_reason = why
            else:
                await self._explain([job], now, resources_too=True)
        elif job.status == "blocked":
            job.waiting_reason = "blocked: waits for " + ", ".join(
                f"{name} ({status})" for name, status, _ in deps if status in
                ("blocked", "waiting", "running"))
        uses, why = await self.store.job_limits(job.job_id, job.priority,
                                                job.status == "waiting", self.limit_book)
        job.limits = [LimitUse(name=n, units=u) for n, u in uses]  # a full one, first
        if why is not None:
            limit_service.put_reason(job, why)
        return job

    async def list_jobs(self, p: ListJobs) -> JobList:
        """A page of jobs (filters: status, kind, role, priority). Raises: BadRequest."""
        if p.status is not None and p.status not in JOB_STATUSES:
            raise errors.BadRequest(f"status must be one of {', '.join(JOB_STATUSES)}")
        if p.priority is not None and p.priority not in PRIORITIES:
            raise errors.BadRequest(f"priority must be 0..3, got {p.priority}")
        flt = JobFilter(status=p.status, kind=p.kind, role=p.role, priority=p.priority,
                        limit=max(1, min(p.limit, LIST_LIMIT_MAX)), after=p.after,
                        newest_first=p.newest_first)
        now = self.clock.wall()
        if budgets.reply_budgeted():  # the page's bytes reserved before it is read
            await budgets.reserve_reply(await self.store.page_reply_bytes(flt))
        page: JobList = await self.store.list_jobs(flt)
        await self.explain_waiting(page.jobs, now)
        return page

    async def explain_waiting(self, jobs: list[JobView], now: float) -> None:
        """Put why each waiting job of `jobs` is not running at `now` into its
        `waiting_reason` (`list`, and the web view's job lists)."""
        await self._explain(jobs, now, resources_too=True)
        await self._limit_reasons(jobs)

    async def _explain(self, jobs: list[JobView], now: float, resources_too: bool) -> None:
        """Gates, roles, kinds (coordd.rules.explain) and, `resources_too`, which resource is
        short on which live worker that could run a job asking for some."""
        waiting = [j for j in jobs if j.status == "waiting"]
        if not waiting:
            return
        book = await self.store.explain_book()
        stale_s = self.config.heartbeat_stale_s
        for j in waiting:
            j.waiting_reason = explain.why_waiting(j, now, book.rows, book.states,
                                                   self._policies, stale_s)
        runnable = [j for j in waiting if (j.waiting_reason or "").startswith("runnable")]
        if not (resources_too and runnable):
            return
        requests, grants = await self.store.resource_book([j.job_id for j in runnable])
        for j in runnable:
            if j.job_id in requests:
                why = resources.shortfall(requests[j.job_id], explain.open_runners(
                    j, now, book.rows, book.states, self._policies, stale_s), grants)
                j.waiting_reason = why or j.waiting_reason

    async def _limit_reasons(self, jobs: list[JobView]) -> None:
        """Put the limit that holds each waiting job back into its `waiting_reason` (in
        front of a gate's; instead of "runnable")."""
        waiting = [(j.job_id, j.priority) for j in jobs if j.status == "waiting"]
        if not waiting or not self.limit_book.active:
            return
        why = await self.store.limit_reasons(waiting, self.limit_book)
        for j in jobs:
            reason = why.get(j.job_id)
            if reason is not None:
                limit_service.put_reason(j, reason)

    async def workers(self, p: Empty | None = None) -> WorkersResult:
        """Every known worker with its readings, heartbeat age and per-priority gate
        verdicts (coordd.rules.worker_list)."""
        book = await self.store.worker_book()
        return WorkersResult(workers=worker_views(
            book.rows, book.now, self.config.heartbeat_stale_s, self._policies, book.states,
            book.notes, book.grants, book.reserved))

    async def workflow_get(self, p: WorkflowId) -> WorkflowView:
        """One workflow with every node; a waiting node's `reason` says why it is not
        running, as `show` does for a job. Raises: NotFound, BadRequest (an ambiguous
        `prefix`)."""
        check_id("workflow_id", p.workflow_id)
        wid = await self.store.resolve_id("workflow", p.workflow_id) if p.prefix \
            else p.workflow_id
        wf: WorkflowView = await self.store.workflow_get(wid)
        waiting = [n for n in wf.nodes if n.status == "waiting"]
        if waiting:
            now = self.clock.wall()
            jobs = [await self.store.get_job(n.job_id) for n in waiting]
            await self._explain(jobs, now, resources_too=False)
            await self._limit_reasons(jobs)  # a full limit, first
            for n, job in zip(waiting, jobs):
                n.reason = job.waiting_reason
        return wf
