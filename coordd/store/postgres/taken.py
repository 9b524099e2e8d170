"""A job just taken by a PostgreSQL claim (the plain claim, coordd.store.postgres.claims,
and the admission path, coordd.store.postgres.admission): its row decoded into the
ClaimResult the worker gets, or, when its stored payload or checkpoint is not JSON, the
job ended `failed` (coordd.rules.transitions.dead_letter).
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.rules import gates
from coordd.rules import transitions as tr
from coordd.wire.protocol import ClaimedJob, ClaimResult, LeaseGrant
from coordd.store import json_decode, maybe_json
from coordd.store.postgres import workflows


class Undecodable(Exception):
    """A taken job's stored payload or checkpoint is not JSON (`code`: coordd.rules.gates)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def claimed(row: Any) -> ClaimResult:
    """A ClaimResult from (job columns..., token, expires_at, lease_s).

    Raises: Undecodable (the stored payload or checkpoint is not JSON).
    """
    job_id, kind, role, prio, payload_json, attempts, checkpoint_json, max_runtime_s, \
        token, expires_at, lease_s = row
    try:
        payload = json_decode(payload_json)
    except msgspec.DecodeError as exc:
        raise Undecodable(gates.PAYLOAD_DECODE_ERROR, str(exc)) from exc
    try:
        checkpoint = maybe_json(checkpoint_json)
    except msgspec.DecodeError as exc:
        raise Undecodable(gates.CHECKPOINT_DECODE_ERROR, str(exc)) from exc
    return ClaimResult(
        job=ClaimedJob(job_id=job_id, kind=kind, required_role=role, priority=prio,
                       payload=payload, attempts=attempts, checkpoint=checkpoint,
                       max_runtime_s=max_runtime_s),
        lease=LeaseGrant(token=token, expires_at=expires_at, lease_s=lease_s))


async def dead_letter(conn: Any, now: float | None, row: Any, worker_id: str) -> None:
    """End `failed` a job just taken whose payload or checkpoint does not decode."""
    try:
        claimed(row)
    except Undecodable as bad:
        d = tr.dead_letter(tr.RUNNING, bad.code, bad.detail)  # counted by the take already
        await workflows.dead_letter_taken(conn, now, row[0], worker_id, d)
