"""A worker's life as coordd sees it: incarnations, the kinds it runs, goodbye, forget,
and `release` (a job handed back without spending an attempt).

`Lifecycle` serves the RPC methods `release`, `goodbye` and `forget_worker` for the
Coordinator (see coordd.service) and says what `heartbeat`, `workers` and a waiting
job's reason need to know about a worker beyond its readings. The rule: a lease is only
ever ended here through the writer, and never while its holder may still speak for it
(a new incarnation, a goodbye, or an admin's `--force`).
"""

from __future__ import annotations

import logging
from typing import Any

from coordd import errors, leases, values
from coordd.clock import Clock
from coordd.config import Config
from coordd.names import check_name, escape
from coordd.protocol import Heartbeat, StatusResult
from coordd.protocol_workers import ForgetWorker, Goodbye, Release, ReleasedResult
from coordd.store import dumps
from coordd.store import workers as wkstore
from coordd.store.workers import WorkerState
from coordd.writer import Writer

logger = logging.getLogger(__name__)

REASON_MAX_CHARS = 500  # a broken kind's reason, as the worker sent it
KINDS_MAX = 1000
LIFECYCLE_METHODS = ("release", "goodbye", "forget_worker")


def _clip(text: str, limit: int) -> str:
    text = escape(text)
    return text if len(text) <= limit else text[:limit] + "..."


class Lifecycle:
    """The worker-lifecycle operations over the Coordinator's writer and reader."""

    def __init__(self, writer: Writer, read: Any, config: Config, clock: Clock) -> None:
        self._writer, self._read, self._config, self._clock = writer, read, config, clock

    def heartbeat_state(self, p: Heartbeat) -> tuple[str | None, str | None]:
        """Check and encode a heartbeat's kinds: (kinds JSON or None, broken kinds JSON or
        None). Raises: errors.BadRequest (a bad kind name, too many kinds)."""
        if p.incarnation is not None:
            check_name("incarnation", p.incarnation)
        if len(p.kinds or ()) + len(p.broken_kinds) > KINDS_MAX:
            raise errors.BadRequest(f"at most {KINDS_MAX} kinds")
        for kind in [*(p.kinds or ()), *p.broken_kinds]:
            check_name("kind", kind)
        kinds = None if p.kinds is None else dumps(sorted(set(p.kinds)))
        broken = {k: _clip(v, REASON_MAX_CHARS) for k, v in sorted(p.broken_kinds.items())}
        return kinds, (dumps(broken) if broken else None)

    def log_lost(self, worker_id: str, lost: list[str], why: str) -> None:
        """Log leases ended because their worker is gone."""
        if lost:
            logger.warning("worker %s %s: %d lease(s) released (worker_lost)", worker_id, why,
                           len(lost), extra={"action": "worker_lost", "worker_id": worker_id,
                                             "jobs": lost})

    async def release(self, p: Release) -> StatusResult:
        """Hand a held job back without spending an attempt (coordd.leases.release).
        Raises: the lease errors, BadRequest, PayloadTooLarge (checkpoint)."""
        reason = _clip(p.reason or "released", self._config.max_error_chars)
        ckpt = None if p.checkpoint is None else values.encode(
            "checkpoint", p.checkpoint, self._config.max_checkpoint_bytes)
        res = await self._writer.run(lambda conn, now: leases.release(
            conn, now, p.job_id, p.worker_id, p.token, reason, ckpt), urgent=True)
        logger.info("job %s released by %s: %s", p.job_id, p.worker_id, reason,
                    extra={"action": "release", "job_id": p.job_id, "worker_id": p.worker_id})
        return res

    async def goodbye(self, p: Goodbye) -> ReleasedResult:
        """Mark the worker offline now; leases it still holds end (`worker_lost`).
        Raises: NotFound (never sent a heartbeat), BadRequest."""
        check_name("worker_id", p.worker_id)
        lost = await self._writer.run(
            lambda conn, now: wkstore.goodbye(conn, now, p.worker_id, p.incarnation), urgent=True)
        logger.info("worker %s said goodbye", p.worker_id,
                    extra={"action": "worker_goodbye", "worker_id": p.worker_id})
        self.log_lost(p.worker_id, lost, "stopped")
        return ReleasedResult(released=lost)

    async def forget_worker(self, p: ForgetWorker) -> ReleasedResult:
        """Drop a dead worker (see coordd.store.workers.forget). Raises: NotFound,
        InvalidState (live or holding leases without `force`)."""
        check_name("worker_id", p.worker_id)
        stale_s = self._config.heartbeat_stale_s
        lost = await self._writer.run(
            lambda conn, now: wkstore.forget(conn, now, p.worker_id, stale_s, p.force))
        logger.info("worker %s forgotten", p.worker_id,
                    extra={"action": "worker_forget", "worker_id": p.worker_id})
        self.log_lost(p.worker_id, lost, "forgotten")
        return ReleasedResult(released=lost)

    async def states(self) -> dict[str, WorkerState]:
        """worker_id -> incarnation, kinds, broken kinds, goodbye time."""
        return await self._read(wkstore.worker_states)


def runs_kind(state: WorkerState | None, kind: str) -> bool:
    """Whether a worker takes jobs of `kind` (one that sends no kinds takes any)."""
    return state is None or state.kinds is None or kind in state.kinds


def kind_absent_reason(kind: str, live: list[str], states: dict[str, WorkerState]) -> str:
    """Why no worker of `live` (ids with the job's role) takes `kind`, naming the workers
    where it is broken and why."""
    broken = [f"{w}: {states[w].broken_kinds[kind]}" for w in live
              if w in states and kind in states[w].broken_kinds]
    return f"no live worker runs kind {kind}" + (f" (broken on {'; '.join(broken)})"
                                                  if broken else "")
