"""Intake: an `enqueue` request made into a job row, with every check a new job passes.

Names, priority, attempts, times and durations (coordd.rules.times), gates, the result schema,
the payload's JSON (coordd.rules.values) and, with an idempotency key, the request's hash
(coordd.rules.idempotency). Pure: nothing is written; the Coordinator queues the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordd import errors, store
from coordd.rules import resources
from coordd.rules import results
from coordd.rules import values
from coordd.rules.idempotency import request_hash
from coordd.rules.names import check_name
from coordd.wire.protocol import ATTEMPTS_MAX, PRIORITIES, Enqueue
from coordd.rules.times import DELAY_MAX_S, check_duration, check_time

if TYPE_CHECKING:
    from coordd.service import Coordinator


def new_job(coord: "Coordinator", p: Enqueue) -> store.NewJob:
    """Check `p` and return the job to insert (its id chosen, its JSON encoded).

    Raises:
        errors.BadRequest: a bad name, priority, attempt count, gate, result schema, a
            time or duration out of range, a non-finite number in the payload or gates.
        errors.PayloadTooLarge: the payload's JSON is over `max_payload_bytes`.
    """
    cfg = coord.config
    check_name("kind", p.kind)
    check_name("required_role", p.required_role)
    if p.priority not in PRIORITIES:
        raise errors.BadRequest(f"priority must be 0..3, got {p.priority}")
    max_attempts = p.max_attempts if p.max_attempts is not None \
        else cfg.max_attempts_default
    if not 1 <= max_attempts <= ATTEMPTS_MAX:
        raise errors.BadRequest(f"max_attempts must be 1..{ATTEMPTS_MAX}, got {max_attempts}")
    check_duration("max_runtime_s", p.max_runtime_s)
    check_time("run_at", p.run_at)
    if p.delay_s is not None:
        if p.run_at is not None:
            raise errors.BadRequest("give run_at or delay_s, not both")
        check_duration("delay_s", p.delay_s, DELAY_MAX_S, zero=True)
        check_time("run_at (now + delay_s)", coord.clock.wall() + p.delay_s)
    if p.idempotency_key is not None:
        check_name("idempotency_key", p.idempotency_key)
    gates_json = None
    if p.gates:
        coord.check_gates(p.priority, p.gates)
        gates_json = values.encode("gates", p.gates, cfg.max_payload_bytes)
    request = resources.parse_request(p.resources)
    if request is not None:
        coord.resources_seen()  # claims look at requests from now on
    uses = coord.limit_book.for_job("limits", p.kind, p.limits)  # fleet-wide limits
    schema = p.result_schema or cfg.result_schemas.get(p.kind)
    if schema is not None and schema not in results.SCHEMAS:
        raise errors.BadRequest(f"unknown result_schema {schema!r}")
    return store.NewJob(
        job_id=coord.new_job_id(), kind=p.kind, required_role=p.required_role,
        priority=p.priority,
        payload_json=values.encode("payload", p.payload, cfg.max_payload_bytes),
        run_at=p.run_at, max_attempts=max_attempts, idempotency_key=p.idempotency_key,
        max_runtime_s=p.max_runtime_s, gates_json=gates_json, result_schema=schema,
        delay_s=p.delay_s, resources=request, limits=uses,
        request_sha256=(None if p.idempotency_key is None
                        else request_hash(p, max_attempts, schema,
                                     uses if p.limits is not None else None)))

