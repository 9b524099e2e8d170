"""Wire Structs of the worker-lifecycle methods (issue 14): `release`, `goodbye`,
`forget_worker`. Data only, no I/O.

Registered in coordd.wire.protocol's PARAMS and ADMIN_METHODS (kept apart for that module's
size); self-contained, so either module may be imported first. Same evolution rules: new
fields get defaults and go last; a field's type never changes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.wire.claims import ClaimAsk


class Release(msgspec.Struct, kw_only=True):
    """`release`: hand a held job back without spending an attempt, fenced like
    `complete` by (job_id, worker_id, token); `checkpoint`, if not None, is recorded
    first. `reason` goes to the job's event log and `last_error`."""

    job_id: str
    worker_id: str
    token: int
    reason: str = ""
    checkpoint: Any = None
    next: ClaimAsk | None = None  # then claim the worker's next job (coordd.wire.claims)


class Goodbye(msgspec.Struct, kw_only=True):
    """`goodbye`: a worker stops; it is offline at once and leases it still holds end
    (`worker_lost`). A goodbye naming an older incarnation changes nothing."""

    worker_id: str
    incarnation: str | None = None


class ForgetWorker(msgspec.Struct, kw_only=True):
    """`forget_worker` (admin): drop a dead worker's row; `force` also drops a live one
    or one holding leases (they end as `worker_lost`)."""

    worker_id: str
    force: bool = False


class ReleasedResult(msgspec.Struct, kw_only=True):
    """`goodbye` / `forget_worker` result: the jobs whose leases ended (`worker_lost`)."""

    released: list[str] = []


WORKER_PARAMS: dict[str, type[msgspec.Struct]] = {
    "release": Release,
    "goodbye": Goodbye,
    "forget_worker": ForgetWorker,
}
"""The worker-lifecycle methods and their params Structs (merged into protocol.PARAMS)."""

WORKER_ADMIN_METHODS = frozenset({"forget_worker"})
