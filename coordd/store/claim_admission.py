"""The claim's resource step, inside the writer's transaction (coordd.rules.resources decides).

One `Admission` per claim: the worker's held grants are read once, on the first candidate
that asks for anything; a candidate without a request (its own, or its kind's default in
the worker's heartbeat `kind_resources`) costs one lookup in a small table, and nothing
at all while no job ever asked for resources and the worker names no kind defaults.
A job refused for resources that would fit once this worker's running jobs end holds
that capacity back from lower priorities for the rest of the claim (`hold_back`): a big
job is not starved by a stream of small ones; they backfill only what it cannot use.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from coordd.rules import resources
from coordd.wire.protocol import ClaimResult
from coordd.rules.resources import Grant, Request
from coordd.store import resources as resstore

KIND_RESOURCES = "kind_resources"  # the heartbeat key of a worker's per-kind defaults


def needed(seen: bool, heartbeat_json: str) -> bool:
    """Whether a claim must look at requests at all: a job ever asked for resources
    (`seen`), or the worker's heartbeat names kind defaults."""
    return seen or KIND_RESOURCES in heartbeat_json


class Admission:
    """Resource admission for one claim by `worker_id` with its decoded `readings`."""

    def __init__(self, conn: sqlite3.Connection, worker_id: str,
                 readings: dict[str, Any]) -> None:
        self._conn, self._worker_id, self._readings = conn, worker_id, readings
        self._held: list[Grant] | None = None
        self._shadows: list[tuple[int, str, Grant]] = []  # (priority, job_id, held back)
        self.grants: dict[str, Grant] = {}
        defaults = readings.get(KIND_RESOURCES)
        self._defaults: dict[str, Request] = {}
        for kind, value in (defaults.items() if isinstance(defaults, dict) else ()):
            try:
                req = msgspec.convert(value, Request)
            except (msgspec.ValidationError, TypeError):
                continue  # a malformed default from a foreign worker: not a request
            if not req.empty:
                self._defaults[str(kind)] = req

    def request(self, job_id: str) -> Request | None:
        """The job's request: its own, else its kind's default on this worker."""
        req = resstore.request_of(self._conn, job_id)
        if req is None and self._defaults:
            req = self._defaults.get(resstore.kind_of(self._conn, job_id) or "")
        return req

    def admit(self, job_id: str, prio: int | None = None) -> str | None:
        """None when the job fits (its grant kept in `grants`), else why not. With its
        `prio`, capacity held back for higher priorities counts as taken, and a refused
        job that would fit once the running jobs end holds its share back."""
        req = self.request(job_id)
        if req is None:
            return None
        if self._held is None:
            self._held = resstore.held_by_worker(self._conn, self._worker_id)
        ahead = [s for s in self._shadows if prio is not None and s[0] < prio]
        got = resources.fit(self._readings, req, self._held + [g for _, _, g in ahead])
        if isinstance(got, str):
            if ahead and not isinstance(resources.fit(self._readings, req, self._held), str):
                p, j, _ = ahead[0]
                return f"{got} (held back for P{p} job {j}, waiting for running jobs to end)"
            if prio is not None:
                shadow = resources.hold_back(self._readings, req, self._held,
                                             [g for _, _, g in self._shadows])
                if shadow is not None:
                    self._shadows.append((prio, job_id, shadow))
            return got
        self.grants[job_id] = got
        return None

    def record(self, result: ClaimResult | None) -> ClaimResult | None:
        """Put a taken job's grant on its new lease and its GPUs in the reply."""
        if result is None or result.job is None:
            return result
        grant = self.grants.get(result.job.job_id)
        if grant is not None:
            resstore.set_grant(self._conn, result.job.job_id, grant)
            result.job.gpu_ids = list(grant.gpu_ids) or None
        return result
