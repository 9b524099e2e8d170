"""The coordinator: every RPC method, its checks and the maintenance round, once, over
one store (coordd.store.api: SQLiteStore or PostgresStore).

`Coordinator` (coordd.service.coordinator) has one coroutine per RPC method (DESIGN.md,
"Wire protocol"): the jobs and leases (coordinator), the reads and explanations (reads),
limits and workflows (areas); the hub, job logs and enrolment are coordd.service.hub, coordd.service.logs
and coordd.service.enrol, artifacts coordd.service.transfers, prune and check coordd.service.maintenance,
schedules coordd.service.workflows, the web view's reads coordd.service.web_reads and the parked calls
coordd.service.waits, over the same store.
This package imports coordd's rules and the store interface; no store imports it.
"""

from coordd.service.checks import LIST_LIMIT_MAX, _truncate, checked_readings
from coordd.service.coordinator import Coordinator

__all__ = ["LIST_LIMIT_MAX", "Coordinator", "_truncate", "checked_readings"]
