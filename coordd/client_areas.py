"""The client library's typed calls, grouped by area: jobs and admin, workflows and
schedules, the agent message hub, and parked calls (push). `coordd.client.Client` inherits
them all: use it, not these classes, which only hold the wrappers (each area's methods
beside each other).
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.wire.limits import LimitsResult, LimitView
from coordd.wire.protocol import (
    AckResult, AgentsResult, AgentView, BackupResult, JobList, JobView, MetricsResult,
    ReadResult, ReapResult, SendResult, StatusReply, StatusResult, WorkersResult,
)
from coordd.wire.push import EventFilter, EventsResult, WaitJobResult, WorkerActions
from coordd.wire.workflows import (
    ScheduleList, ScheduleView, WorkflowList, WorkflowSubmit, WorkflowSubmitResult, WorkflowView,
)


class Caller:
    """What the wrappers need of the Client: `call` and the call timeout."""

    timeout: float

    async def call(self, method: str, params: Any = None, result_type: Any = None,
                   timeout: float | None = None, on_sent: Any = None) -> Any:
        """Send one request and return its decoded result (coordd.client.Client.call)."""
        raise NotImplementedError


class AdminCalls(Caller):
    """Jobs, workers and the admin calls (docs/reference/protocol.md)."""

    async def cancel(self, job_id: str) -> StatusResult:
        """Cancel a job."""
        return await self.call("cancel", {"job_id": job_id}, StatusResult)

    async def retry(self, job_id: str) -> StatusResult:
        """Retry a failed or cancelled job."""
        return await self.call("retry", {"job_id": job_id}, StatusResult)

    async def reap(self) -> ReapResult:
        """Reap expired leases now."""
        return await self.call("reap", {}, ReapResult)

    async def status(self) -> StatusReply:
        """Counts of workers, leases and jobs."""
        return await self.call("status", {}, StatusReply)

    async def get_job(self, job_id: str, prefix: bool = False) -> JobView:
        """One job with lease and events; with `prefix`, `job_id` may be the start of one
        job's id (BadRequest if it starts several)."""
        params: dict[str, Any] = {"job_id": job_id}
        if prefix:
            params["prefix"] = True
        return await self.call("get_job", params, JobView)

    async def list_jobs(self, **filters: Any) -> JobList:
        """A page of jobs (status, kind, role, priority, limit, after)."""
        return await self.call("list_jobs", filters, JobList)

    async def workers(self) -> WorkersResult:
        """Workers with readings and gate verdicts."""
        return await self.call("workers", {}, WorkersResult)

    async def backup(self, dest: str) -> BackupResult:
        """Make a verified backup at `dest` (a path on coordd's host)."""
        return await self.call("backup", {"dest": dest}, BackupResult)

    async def check(self) -> dict[str, Any]:
        """quick_check and foreign_key_check of the live database."""
        return await self.call("check", {})

    async def metrics(self) -> MetricsResult:
        """Every metric series, as Prometheus text."""
        return await self.call("metrics", {}, MetricsResult)

    async def limits(self, name: str | None = None) -> LimitsResult:
        """Fleet-wide limits (or one) with their use now and who holds units."""
        return await self.call("limits", {"name": name}, LimitsResult)

    async def limits_set(self, name: str, settings: dict[str, Any]) -> LimitView:
        """Change (or create) a limit at runtime (admin); kept over a restart."""
        return await self.call("limits_set", {"name": name, "settings": settings}, LimitView)

    async def limits_reset(self, name: str) -> LimitsResult:
        """Drop a limit's runtime override (admin): back to the config."""
        return await self.call("limits_reset", {"name": name}, LimitsResult)


class WorkflowCalls(Caller):
    """Workflows (graphs of jobs) and recurring schedules (docs/concepts/workflows.md)."""

    async def workflow_submit(self, spec: WorkflowSubmit | dict[str, Any]) -> WorkflowSubmitResult:
        """Submit a whole graph (protocol.WorkflowSubmit) in one transaction."""
        return await self.call("workflow_submit", spec, WorkflowSubmitResult)

    async def workflow_get(self, workflow_id: str, prefix: bool = False) -> WorkflowView:
        """One workflow with every node's state (`prefix`: `workflow_id` may be the start of
        one workflow's id)."""
        return await self.call("workflow_get", {"workflow_id": workflow_id, "prefix": prefix},
                               WorkflowView)

    async def workflow_list(self, status: str | None = None, limit: int = 100) -> WorkflowList:
        """Workflows, newest first."""
        return await self.call("workflow_list", {"status": status, "limit": limit},
                               WorkflowList)

    async def workflow_cancel(self, workflow_id: str, prefix: bool = False) -> WorkflowView:
        """Cancel every node of a workflow that has not ended (`prefix` as in workflow_get)."""
        return await self.call("workflow_cancel", {"workflow_id": workflow_id, "prefix": prefix},
                               WorkflowView)

    async def schedule_add(self, name: str, cron: str,
                           workflow: WorkflowSubmit | dict[str, Any],
                           replace: bool = False) -> ScheduleView:
        """Add a recurring schedule that starts `workflow` at each cron slot (UTC);
        `replace` updates one of this name that has another cron or workflow."""
        params = {"name": name, "cron": cron, "workflow": workflow}
        if replace:  # sent only when set: a plain add still works with an older coordd
            params["replace"] = True
        return await self.call("schedule_add", params, ScheduleView)

    async def schedule_list(self) -> ScheduleList:
        """Every schedule."""
        return await self.call("schedule_list", {}, ScheduleList)

    async def schedule_remove(self, name: str) -> None:
        """Delete a schedule by name or id."""
        await self.call("schedule_remove", {"name": name})


class HubCalls(Caller):
    """The agent message hub: messages, broadcasts, agents' status."""

    async def send_message(self, sender: str, recipient: str, content: Any,
                           **fields: Any) -> SendResult:
        """Send a message (fields: message_type, priority, metadata, ttl_s, message_id)."""
        return await self.call("send_message", {"sender": sender, "recipient": recipient,
                                                "content": content, **fields}, SendResult)

    async def broadcast(self, sender: str, content: Any, **fields: Any) -> SendResult:
        """Send a message every reader but `sender` gets once."""
        return await self.call("broadcast", {"sender": sender, "content": content, **fields},
                               SendResult)

    async def read_messages(self, reader: str, **fields: Any) -> ReadResult:
        """Read `reader`'s messages (fields: limit, visibility_s, ack, ack_on_read)."""
        return await self.call("read_messages", {"reader": reader, **fields}, ReadResult)

    async def ack_messages(self, reader: str, message_ids: list[str]) -> AckResult:
        """Mark messages handled: they are not delivered to `reader` again."""
        return await self.call("ack_messages", {"reader": reader, "message_ids": message_ids},
                               AckResult)

    async def update_agent_status(self, name: str, status: str,
                                  metadata: dict[str, Any] | None = None) -> AgentView:
        """Record an agent's status (its heartbeat)."""
        return await self.call("update_agent_status", {"name": name, "status": status,
                                                       "metadata": metadata}, AgentView)

    async def get_agent_status(self, name: str | None = None, **page: Any) -> AgentsResult:
        """One agent's status, or a page of agents (`limit`, `after`: see AgentQuery)."""
        return await self.call("get_agent_status", {"name": name, **page}, AgentsResult)


class PushCalls(Caller):
    """Parked calls: answered when something happens, or at their wait."""

    async def wait_job(self, job_id: str, timeout_s: float) -> WaitJobResult:
        """Wait at coordd up to `timeout_s` (coordd cuts it to its `park_wait_max_s`) for
        the job to be terminal; `job` is a JobView, `terminal` False at the timeout.

        Raises: NotFound, Overloaded (coordd's cap on parked calls), UnknownMethod (an
        older coordd).
        """
        raw = await self.call("wait_job", {"job_id": job_id, "timeout_s": timeout_s},
                              timeout=self.timeout + timeout_s)
        return WaitJobResult(job=msgspec.convert(raw["job"], JobView), terminal=raw["terminal"])

    async def watch_worker(self, worker_id: str, wait_s: float,
                           seen: WorkerActions | None = None) -> WorkerActions:
        """The actions coordd asks of `worker_id` for the jobs it holds, as soon as one is
        not in `seen` (else after `wait_s`)."""
        params = {"worker_id": worker_id, "wait_s": wait_s, "seen": seen or WorkerActions()}
        return await self.call("watch_worker", params, WorkerActions,
                               timeout=self.timeout + wait_s)

    async def watch_events(self, after: int = 0, wait_s: float = 0.0, limit: int = 100,
                           filter: EventFilter | dict[str, Any] | None = None) -> EventsResult:
        """Job events after the cursor `after`, parked up to `wait_s` while there are none;
        continue from the reply's `next_after`."""
        params = {"after": after, "wait_s": wait_s, "limit": limit, "filter": filter or {}}
        return await self.call("watch_events", params, EventsResult,
                               timeout=self.timeout + wait_s)
