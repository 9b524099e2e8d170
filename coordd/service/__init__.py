"""The coordinator: every RPC method, its checks and the maintenance round, once, over
one store (coordd.store.api: SQLiteStore or PostgresStore).

`Coordinator` (coordd.service.coordinator) has one coroutine per RPC method (DESIGN.md,
"Wire protocol"): the jobs and leases (coordinator), the reads and explanations (reads),
limits and workflows (areas); the hub, job logs and enrolment are coordd.hub, coordd.logs
and coordd.enrol, artifacts coordd.transfers, prune and check coordd.maintenance, and
schedules coordd.workflows, over the same store. The areas the store interface does not cover yet
are served through one seam, coordd.service.local, on a store that offers them.
This package imports coordd's rules and the store interface; no store imports it.
"""

from coordd.service.checks import LIST_LIMIT_MAX, _truncate, checked_readings
from coordd.service.coordinator import Coordinator

__all__ = ["LIST_LIMIT_MAX", "Coordinator", "_truncate", "checked_readings"]
