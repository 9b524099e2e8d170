"""The coordinator: every RPC method, its checks and the maintenance round, once, over
one store (coordd.store.api: SQLiteStore or PostgresStore).

`Coordinator` (coordd.service.coordinator) has one coroutine per RPC method
(docs/reference/protocol.md): the jobs and leases (coordinator), the reads and
explanations (reads),
limits and workflows (areas); the hub, job logs and enrolment are hub, logs and enrol,
artifacts transfers, prune and check maintenance, schedules workflows, the web view's
reads web_reads and the parked calls waits and push (with parked, push_notes, run_at),
over the same store.
May import store, net, ops, rules, wire and the base modules; only the daemon imports it
(the layers contract).
"""

from coordd.service.checks import LIST_LIMIT_MAX, _truncate, checked_readings
from coordd.service.coordinator import Coordinator

__all__ = ["LIST_LIMIT_MAX", "Coordinator", "_truncate", "checked_readings"]
