"""The `workers` reply from stored rows, pure: one WorkerView per worker with its gate
verdicts per priority, governance notes and resource books. Built by coordd.service.reads
over either store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coordd.rules import gates
from coordd.rules import resources
from coordd.rules.gates import GatePolicy
from coordd.wire.protocol import WorkerView
from coordd.rules.worker_state import WorkerState, reading_notes


def worker_views(rows: list[tuple[str, list[str], dict[str, Any], float, int]], now: float,
                 stale_s: float, policies: dict[int, GatePolicy],
                 states: Mapping[str, WorkerState], notes: Mapping[str, list[str]],
                 grants: Mapping[str, list[Any]], reserved: Mapping[str, list[Any]]
                 ) -> list[WorkerView]:
    """WorkerViews of `rows` ((worker_id, roles, readings, heartbeat_at, active leases), as
    coordd.store.views.list_workers returns them) at `now` (s). Live: a heartbeat within
    `stale_s` and no goodbye since. `notes`: governance lines per worker; `grants`,
    `reserved`: what its leases hold and its reservations ask for (coordd.rules.resources)."""
    out = []
    for worker_id, roles, readings, hb_at, n in rows:
        age = now - hb_at
        state = states.get(worker_id, WorkerState())
        live = age <= stale_s and state.offline_at is None
        verdicts = {}
        for prio, policy in policies.items():
            codes = [c for c, _ in gates.evaluate(policy, readings)]
            verdicts[f"p{prio}"] = ([gates.HEARTBEAT_STALE] if not live else []) + codes
        out.append(WorkerView(worker_id=worker_id, roles=roles, readings=readings,
                              heartbeat_at=hb_at, heartbeat_age_s=age, live=live,
                              verdicts=verdicts,
                              notes=reading_notes(readings) + list(notes.get(worker_id, [])),
                              active_leases=n, kinds=state.kinds,
                              broken_kinds=state.broken_kinds,
                              incarnation=state.incarnation, offline_at=state.offline_at,
                              resources=resources.summary(readings, grants.get(worker_id, ()),
                                                          reserved.get(worker_id, ()))))
    return out
