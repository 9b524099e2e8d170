"""The checks an RPC method makes before its store is asked (sizes, names, readings),
and the small conversions from wire params to store arguments."""

from __future__ import annotations

from typing import Any

import msgspec

from coordd import errors
from coordd.rules import resources
from coordd.rules import values
from coordd.rules.names import check_id, check_name
from coordd.wire.protocol import Heartbeat, Readings
from coordd.store.api import LeaseRef

LIST_LIMIT_MAX = 1000


def checked_readings(p: Heartbeat, max_bytes: int) -> tuple[dict[str, Any], str]:
    """Check a heartbeat's worker id, roles and readings; return the readings to store (a
    NaN or infinite gate reading made unknown) and their JSON.

    Raises: errors.BadRequest (a bad name, readings types or GPU devices),
    errors.PayloadTooLarge (the readings' JSON is over `max_bytes`).
    """
    check_name("worker_id", p.worker_id)
    for role in p.roles:
        check_name("role", role)
    try:
        msgspec.convert(p.readings, Readings)
    except msgspec.ValidationError as exc:
        raise errors.BadRequest(f"readings: {exc}") from exc
    resources.check_readings(p.readings)  # GPU devices: bounded, unique, in range
    readings = values.unknown_if_not_finite(p.readings)  # a NaN gate reading: unknown
    return readings, values.encode("readings", readings, max_bytes)


def truncate(text: str, limit: int) -> str:
    """Cut `text` to `limit` characters and make it storable: what UTF-8 cannot encode
    (lone surrogates) is escaped, so recording a failure cannot itself fail."""
    if len(text) > limit:
        text = text[:limit] + f"... [truncated {len(text) - limit} chars]"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_truncate = truncate  # the name the callers of coordd.service knew


def lease_ref(p: Any) -> LeaseRef:
    """The lease a holder call's params present (job_id, worker_id, token).
    Raises: errors.BadRequest (a control character in an id: coordd.rules.names.check_id)."""
    check_id("job_id", p.job_id)
    check_id("worker_id", p.worker_id)
    return LeaseRef(job_id=p.job_id, worker_id=p.worker_id, token=p.token)
