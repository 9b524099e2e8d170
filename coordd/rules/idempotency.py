"""The hash that tells a resent request from another one under the same idempotency key.

A job made with a key stores `request_hash` of its request (jobs.request_sha256, schema
v9); a later enqueue with that key is the same request when its hash is the same (it gets
the stored job back, `created` False) and is refused with `invalid_state` otherwise
(coordd.store.jobs.enqueue). Workflows do the same with their graph (coordd.service.workflows.spec_hash).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from coordd.wire.protocol import Enqueue

_encode_sorted = msgspec.json.Encoder(order="sorted").encode


def request_hash(p: Enqueue, max_attempts: int, result_schema: str | None,
                 limits: list[tuple[str, int]] | None = None) -> str:
    """sha256 of what makes the job: every field of `p` but its key, with the defaults
    coordd filled in (`max_attempts`, `result_schema`), object keys in sorted order and
    empty gates read as none. `run_at` and `delay_s` count as sent: a client resending
    the same request sends the same values (coordctl's `--delay` is sent as `delay_s`)."""
    fields: list[Any] = [p.kind, p.required_role, p.priority, p.payload, p.run_at, p.delay_s,
                         max_attempts, p.max_runtime_s, p.gates or None, result_schema]
    if p.resources:  # after the others: hashes of requests without resources are unchanged
        fields.append(p.resources)
    if limits:  # only then: a key stored before limits existed keeps its hash
        fields.append([list(u) for u in limits])
    return hashlib.sha256(_encode_sorted(fields)).hexdigest()
