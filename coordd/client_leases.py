"""The client library's calls of a worker and its leases: heartbeat, claim (up to
`max_jobs` at once), renew, checkpoint, log output, and the reports (`complete`, `fail`,
`release`) that may claim the worker's next job in the same call (`next`,
coordd.wire.claims.ClaimAsk). `coordd.client.Client` inherits them: use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordd.client_areas import Caller
from coordd.wire.claims import ClaimAsk
from coordd.wire.logs import JobLogs, LogAppendResult
from coordd.wire.protocol import (
    ClaimResult, CompleteResult, HeartbeatResult, RenewResult, StatusResult,
)
from coordd.wire.workers import ReleasedResult


def _with_next(params: dict[str, Any], next: ClaimAsk | None) -> dict[str, Any]:
    """A report's `params`, with `next` (the worker's next claim) where it asks for one."""
    if next is not None:
        params["next"] = next
    return params


class LeaseCalls(Caller):
    """A worker's calls (docs/concepts/leases.md). A report's `next` asks coordd to claim
    the worker's next job once the report is stored; the reply's `next` is that claim's
    ClaimResult (no job: nothing due), or None from an older coordd that does not."""

    async def heartbeat(self, worker_id: str, roles: list[str], readings: dict[str, Any],
                        **fields: Any) -> HeartbeatResult:
        """Send a heartbeat (`fields`: incarnation, kinds, broken_kinds of
        protocol.Heartbeat); returns coordd's time and held jobs to cancel."""
        return await self.call("heartbeat", {"worker_id": worker_id, "roles": roles,
                                             "readings": readings, **fields}, HeartbeatResult)

    async def release(self, job_id: str, worker_id: str, token: int, reason: str,
                      checkpoint: Any = None, next: ClaimAsk | None = None) -> StatusResult:
        """Hand a held job back without spending its attempt (protocol.Release); `next`:
        then claim the worker's next job (see the class)."""
        return await self.call("release", _with_next(
            {"job_id": job_id, "worker_id": worker_id, "token": token, "reason": reason,
             "checkpoint": checkpoint}, next), StatusResult)

    async def goodbye(self, worker_id: str, incarnation: str | None = None) -> ReleasedResult:
        """Say this worker stops: offline at once; leases it still holds end."""
        return await self.call("goodbye", {"worker_id": worker_id, "incarnation": incarnation},
                               ReleasedResult)

    async def forget_worker(self, worker_id: str, force: bool = False) -> ReleasedResult:
        """Drop a dead worker from `workers` (`force`: a live one too; admin)."""
        return await self.call("forget_worker", {"worker_id": worker_id, "force": force},
                               ReleasedResult)

    async def claim(self, worker_id: str, lease_s: float | None = None,
                    claim_id: str | None = None, kinds: list[str] | None = None,
                    wait_s: float = 0.0, on_sent: Callable[[], None] | None = None,
                    max_jobs: int = 1) -> ClaimResult:
        """Claim a job (see protocol.Claim); `kinds` limits it to kinds this worker runs;
        `wait_s` > 0 parks the claim at coordd up to that long while nothing is claimable
        (an older coordd answers at once); `max_jobs` > 1 takes up to that many, the
        others in the result's `more` (an older coordd hands out one)."""
        params: dict[str, Any] = {"worker_id": worker_id, "lease_s": lease_s,
                                  "claim_id": claim_id, "kinds": kinds}
        if max_jobs != 1:
            params["max_jobs"] = max_jobs
        if wait_s > 0:
            params["wait_s"] = wait_s
            return await self.call("claim", params, ClaimResult, timeout=self.timeout + wait_s,
                                   on_sent=on_sent)
        return await self.call("claim", params, ClaimResult, on_sent=on_sent)

    async def renew(self, job_id: str, worker_id: str, token: int,
                    lease_s: float | None = None,
                    on_sent: Callable[[], None] | None = None) -> RenewResult:
        """Renew a lease (`on_sent`: see `call`)."""
        return await self.call("renew", {"job_id": job_id, "worker_id": worker_id,
                                         "token": token, "lease_s": lease_s}, RenewResult,
                               on_sent=on_sent)

    async def checkpoint(self, job_id: str, worker_id: str, token: int, checkpoint: Any) -> None:
        """Record a checkpoint."""
        await self.call("checkpoint", {"job_id": job_id, "worker_id": worker_id,
                                       "token": token, "checkpoint": checkpoint})

    async def log_append(self, job_id: str, worker_id: str, token: int, stream: str, pos: int,
                         data: bytes) -> LogAppendResult:
        """Store bytes `pos..` of an attempt's `stream` ("stdout"/"stderr"); fenced."""
        return await self.call("log_append", {"job_id": job_id, "worker_id": worker_id,
                                              "token": token, "stream": stream, "pos": pos,
                                              "data": data}, LogAppendResult)

    async def job_logs(self, job_id: str, after: int = 0, attempt: int | None = None,
                       limit_bytes: int = 1 << 20) -> JobLogs:
        """A job's kept model output after cursor `after` (coordd.wire.logs.JobLogs)."""
        return await self.call("job_logs", {"job_id": job_id, "after": after,
                                            "attempt": attempt, "limit_bytes": limit_bytes},
                               JobLogs)

    async def complete(self, job_id: str, worker_id: str, token: int, result: Any,
                       artifact: dict[str, Any] | None = None,
                       usage: dict[str, float] | None = None,
                       next: ClaimAsk | None = None) -> CompleteResult:
        """Report a result (`usage`: counted against the job's limit budgets; `next`: then
        claim the worker's next job, see the class)."""
        params: dict[str, Any] = {"job_id": job_id, "worker_id": worker_id, "token": token,
                                  "result": result, "artifact": artifact}
        if usage:
            params["usage"] = usage
        return await self.call("complete", _with_next(params, next), CompleteResult)

    async def fail(self, job_id: str, worker_id: str, token: int, error: str,
                   retryable: bool, next: ClaimAsk | None = None) -> StatusResult:
        """Report a failure (`next`: then claim the worker's next job, see the class)."""
        return await self.call("fail", _with_next(
            {"job_id": job_id, "worker_id": worker_id, "token": token, "error": error,
             "retryable": retryable}, next), StatusResult)
