"""Workflows: graphs of jobs routed by capability, durable steps, graceful degradation,
and recurring schedules.

- `workflow_submit` validates a graph here (names, unknown dependencies, duplicates,
  cycles, policies, schemas: `bad_request` with a clear message) and queues it whole in
  one store transaction (coordd.service.areas): nodes without dependencies `waiting`,
  the others `blocked`.
- A node becomes a claim candidate when its dependencies have ended and the edges allow
  it (coordd.store.workflows.settle, run in the transaction that ended the last one).
- The maintenance round (`tick`, from the reaper loop, through the writer) skips waiting
  nodes whose capability (`required_role`) no worker with a fresh heartbeat advertised
  for `workflow_absent_wait_s` (reason `worker_absent`), settles every running workflow
  as a backstop, and starts the schedules whose slot has come.
- Schedules: cron expressions (5 fields, UTC) parsed by `cronsim`. Each slot starts one
  workflow whose idempotency key is `schedule:<id>:<slot>`, and the schedule's next slot
  advances in the same transaction, so a slot is started exactly once even across a
  crash or restart. Missed slots (coordd was down) are coalesced: the latest one is run
  once, the older ones are counted in the log and not run — a recurring job wants the
  current state, not a backlog of stale runs.

Why cronsim over croniter: no dependencies (croniter pulls python-dateutil and pytz), a
strict parser that refuses what it does not understand, and it is the parser of
healthchecks.io, maintained for that service's own use.
"""

from __future__ import annotations

import graphlib
import hashlib
import logging
import secrets
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import msgspec
from cronsim import CronSim, CronSimError

from coordd.rules import cron as cron_mod
from coordd import errors
from coordd.rules import resources
from coordd.rules import results
from coordd.rules import values
from coordd.rules.names import check_duration, check_name
from coordd.rules.times import TIME_MIN_S
from coordd.wire.protocol import ATTEMPTS_MAX, PRIORITIES
from coordd.wire.workflows import (
    EDGE_POLICIES, LIST_LIMIT_MAX, WORKFLOW_STATUSES, ListWorkflows, Need, NoParams,
    ScheduleAdd, ScheduleList, ScheduleName, ScheduleView, WorkflowNode, WorkflowSubmit,
    WorkflowSubmitResult,
)
from coordd.jsontext import dumps
from coordd.store import workflows as wstore

if TYPE_CHECKING:
    from coordd.service import Coordinator

logger = logging.getLogger(__name__)

NODES_MAX = 1000
# Dependencies (edges) per workflow, all nodes together. Each settle reads a workflow's
# edges on coordd's single loop; 1000 nodes that each need every earlier one would be
# 499,500 edges and seconds of stall per submit and per completion.
EDGES_MAX = 10_000
CRON_FIELDS = 5
# payload keys coordd writes when it queues a node (coordd.store.workflows.settle)
RESERVED_PAYLOAD_KEYS = frozenset({"inputs", "input_artifacts", "missing_inputs"})
SLOT_SCAN_MAX = 10_000  # missed slots walked one by one before jumping to `now`


def needs_of(node: WorkflowNode) -> list[Need]:
    """The node's edges, with bare names read as policy `skip`."""
    return [Need(node=n) if isinstance(n, str) else n for n in node.needs]


def topo_order(nodes: list[WorkflowNode]) -> list[WorkflowNode]:
    """Return the nodes dependencies-first.

    Raises:
        errors.BadRequest: a duplicate name, an unknown dependency, a bad policy, or a
            cycle (named, e.g. `a -> b -> a`).
    """
    by_name: dict[str, WorkflowNode] = {}
    for n in nodes:
        check_name("node name", n.name)
        if n.name in by_name:
            raise errors.BadRequest(f"duplicate node name {n.name!r}")
        by_name[n.name] = n
    for n in nodes:
        seen = set()
        for need in needs_of(n):
            if need.node not in by_name:
                raise errors.BadRequest(f"node {n.name!r} needs unknown node {need.node!r}")
            if need.policy not in EDGE_POLICIES:
                raise errors.BadRequest(f"node {n.name!r}: policy {need.policy!r} is not one "
                                        f"of {', '.join(EDGE_POLICIES)}")
            if need.node in seen:
                raise errors.BadRequest(f"node {n.name!r} needs {need.node!r} twice")
            seen.add(need.node)
    sorter = graphlib.TopologicalSorter({n.name: [d.node for d in needs_of(n)] for n in nodes})
    try:
        return [by_name[name] for name in sorter.static_order()]
    except graphlib.CycleError as exc:
        # graphlib names the cycle from a node to what needs it; ours reads "a needs b"
        cycle = list(reversed(exc.args[1]))
        raise errors.BadRequest(f"dependency cycle: {' -> '.join(cycle)}") from None


def spec_hash(p: WorkflowSubmit) -> str:
    """sha256 of a graph as submitted, its key left out and each node's `needs` written
    out in full (`"a"` is `{node = "a", policy = "skip"}`), nodes in name order: the same
    graph hashes the same however its file lists it."""
    nodes = sorted(
        (msgspec.structs.replace(n, needs=sorted(needs_of(n), key=lambda d: d.node))
         for n in p.nodes), key=lambda n: n.name)
    # a node without resources, or naming no limits, hashes as before the field existed
    # (stored graphs' keys)
    shown = [{k: v for k, v in msgspec.structs.asdict(n).items()
              if not (k == "resources" and not n.resources)
              and not (k == "limits" and n.limits is None)} for n in nodes]
    return hashlib.sha256(msgspec.json.encode([p.name, shown], order="sorted")).hexdigest()


def cron_after(cron: str, t: float) -> float:
    """The first slot of `cron` (UTC) strictly after Unix time `t`.

    Raises:
        errors.BadRequest: `cron` is not a valid 5-field expression.
    """
    try:
        return next(CronSim(cron, datetime.fromtimestamp(t, timezone.utc))).timestamp()
    except (CronSimError, StopIteration) as exc:
        why = cron_mod.field_problem(cron, str(exc)) if exc else "no future slot"
        raise errors.BadRequest(f"cron {cron!r}: {why}") from exc


def check_cron(cron: str) -> str:
    """Return `cron` without surrounding space if it is a valid 5-field expression.

    cronsim also reads a sixth field (seconds) and `@daily`-style aliases; coordd's slots
    are minutes, so only the five fields minute hour day month weekday are accepted.

    Raises:
        errors.BadRequest: not exactly 5 fields, or a field cronsim refuses.
    """
    cron = cron.strip()
    fields = cron.split()
    if len(fields) != CRON_FIELDS:
        raise errors.BadRequest(f"cron {cron!r}: {CRON_FIELDS} fields are needed (minute hour "
                                f"day month weekday, UTC), got {len(fields)}")
    cron_after(cron, 0.0)
    return cron


def due_slots(cron: str, next_at: float, now: float) -> tuple[float, float, int]:
    """(the slot to run: the latest at or before `now`, the first slot after `now`, how
    many earlier missed slots are passed over). `next_at <= now` is the stored slot."""
    if not TIME_MIN_S <= next_at <= now:  # a stored slot no calendar has (hand-edited): now
        next_at = now
    slot, passed = next_at, 0
    for _ in range(SLOT_SCAN_MAX):
        following = cron_after(cron, slot)
        if following > now:
            return slot, following, passed
        slot, passed = following, passed + 1
    following = cron_after(cron, now)  # a very long downtime: count roughly, jump ahead
    return slot, following, passed


def check_list(p: ListWorkflows) -> None:
    """Check `workflow_list`'s params. Raises: errors.BadRequest."""
    if p.status is not None and p.status not in WORKFLOW_STATUSES:
        raise errors.BadRequest(f"status must be one of {', '.join(WORKFLOW_STATUSES)}")
    if not 1 <= p.limit <= LIST_LIMIT_MAX:
        raise errors.BadRequest(f"limit must be 1..{LIST_LIMIT_MAX}, got {p.limit}")


def submitted(wf: wstore.NewWorkflow, res: WorkflowSubmitResult) -> WorkflowSubmitResult:
    """Log a newly stored workflow (not a repeated key's); return `res`."""
    if res.created:
        logger.info("workflow %s (%s) submitted with %d node(s)", res.workflow_id, wf.name,
                    len(wf.nodes), extra={"action": "workflow_submit",
                                          "workflow_id": res.workflow_id})
    return res


class Workflows:
    """A graph's checks (`plan`), the schedule methods and the maintenance round (`tick`)
    over the Coordinator's store (coordd.store.api_schedules, api_workflows)."""

    def __init__(self, coord: "Coordinator") -> None:
        self._coord = coord
        # Absence is only judged on what this coordd saw: until it has run for the wait
        # itself, a worker's heartbeat from before a restart (or a long downtime) is no
        # evidence that the capability is gone, so nothing is skipped for worker_absent.
        self._started_mono = coord.clock.mono()

    # ------------------------------------------------------------ planning

    def plan(self, p: WorkflowSubmit, schedule_id: str | None = None,
             key: str | None = None) -> wstore.NewWorkflow:
        """Validate a graph and choose its ids (pure; nothing is written).

        Raises: errors.BadRequest, errors.PayloadTooLarge.
        """
        cfg = self._coord.config
        check_name("workflow name", p.name)
        if not p.nodes or len(p.nodes) > NODES_MAX:
            raise errors.BadRequest(f"a workflow has 1..{NODES_MAX} nodes")
        edges = sum(len(n.needs) for n in p.nodes)
        if edges > EDGES_MAX:
            raise errors.BadRequest(f"a workflow has at most {EDGES_MAX} dependencies "
                                    f"(needs entries, all nodes together); this one has {edges}")
        key = key if key is not None else p.idempotency_key
        if key is not None:
            check_name("idempotency_key", key)
        nodes = []
        for n in topo_order(p.nodes):
            check_name("kind", n.kind)
            check_name("required_role", n.required_role)
            if n.priority not in PRIORITIES:
                raise errors.BadRequest(f"node {n.name!r}: priority must be 0..3")
            attempts = n.max_attempts if n.max_attempts is not None else cfg.max_attempts_default
            if not 1 <= attempts <= ATTEMPTS_MAX:
                raise errors.BadRequest(f"node {n.name!r}: max_attempts must be 1..{ATTEMPTS_MAX}")
            check_duration(f"node {n.name!r}: max_runtime_s", n.max_runtime_s)
            reserved = sorted(RESERVED_PAYLOAD_KEYS & n.payload.keys())
            if reserved:
                raise errors.BadRequest(
                    f"node {n.name!r}: payload keys {', '.join(reserved)} are reserved "
                    f"(coordd puts the dependencies' results there)")
            schema = n.result_schema or cfg.result_schemas.get(n.kind)
            if schema is not None and schema not in results.SCHEMAS:
                raise errors.BadRequest(f"node {n.name!r}: unknown result_schema {schema!r} "
                                        f"(known: {', '.join(sorted(results.SCHEMAS))})")
            gates_json = None
            if n.gates:
                self._coord.check_gates(n.priority, n.gates)
                gates_json = values.encode(f"node {n.name!r}: gates", n.gates,
                                           cfg.max_payload_bytes)
            request = resources.parse_request(n.resources, f"node {n.name!r}: resources")
            if request is not None:
                self._coord.resources_seen()
            # nesting depth, JSON types and size, as for any stored client value
            values.encode(f"node {n.name!r}: payload", n.payload, cfg.max_payload_bytes)
            nodes.append(wstore.NewNode(
                job_id=self._coord.new_job_id(), name=n.name, kind=n.kind,
                required_role=n.required_role, priority=n.priority, payload=n.payload,
                max_attempts=attempts, max_runtime_s=n.max_runtime_s, gates_json=gates_json,
                result_schema=schema, resources=request,
                needs=[(d.node, d.policy) for d in needs_of(n)],
                limits=self._coord.limit_book.for_job(f"node {n.name!r}: limits", n.kind,
                                                      n.limits)))
        return wstore.NewWorkflow(workflow_id=self._coord.new_job_id(), name=p.name,
                                  nodes=nodes, idempotency_key=key, schedule_id=schedule_id,
                                  spec_sha256=spec_hash(p))

    def _plan_slot(self, spec_json: str, schedule_id: str, slot: float) -> wstore.NewWorkflow:
        spec = msgspec.json.decode(spec_json, type=WorkflowSubmit)
        return self.plan(spec, schedule_id, key=f"schedule:{schedule_id}:{slot:.0f}")

    # ------------------------------------------------------------ RPC methods

    async def schedule_add(self, p: ScheduleAdd) -> ScheduleView:
        """Add a recurring schedule; its first slot is the first after now (UTC). A name
        already in use: the same cron and workflow is a repeat (`created` False); another
        is refused unless `replace` (coordd.store.workflows.add_schedule).

        Raises: errors.BadRequest, errors.InvalidState."""
        check_name("schedule name", p.name)
        self.plan(p.workflow)  # refuse a bad graph now, not at its first slot
        cron = check_cron(p.cron)
        now = self._coord.clock.wall()
        first = cron_after(cron, now)
        sid, spec = secrets.token_hex(8), dumps(p.workflow)
        store = self._coord.store
        outcome = await store.schedule_add(sid, p.name, cron, spec, first, p.replace)
        if outcome != "unchanged":
            logger.info("schedule %s %s: %s", p.name, outcome, cron,
                        extra={"action": "schedule_add"})
        view = next(v for v in await store.schedule_list() if v.name == p.name)
        view.created, view.replaced = outcome == "created", outcome == "replaced"
        return view

    async def schedule_list(self, p: NoParams | None = None) -> ScheduleList:
        """Every schedule with its next slot."""
        return ScheduleList(schedules=await self._coord.store.schedule_list())

    async def schedule_remove(self, p: ScheduleName) -> dict[str, Any]:
        """Delete a schedule (workflows it started stay). Raises: NotFound."""
        if not await self._coord.store.schedule_remove(p.name):
            raise errors.NotFound(f"schedule {p.name} not found")
        return {}

    # ------------------------------------------------------------ maintenance

    async def tick(self) -> tuple[int, int, int]:
        """One maintenance round: skip nodes whose capability is absent, settle running
        workflows, start due schedule slots (ended workflows go with `Coordinator.prune`).
        Separate store transactions, in that order: one that fails rolls back alone (what
        the earlier ones stored stays) and ends the round; the reaper retries next interval.
        Returns (skipped, ended, started)."""
        cfg = self._coord.config
        store = self._coord.store
        wait_s, stale_s = cfg.workflow_absent_wait_s, cfg.heartbeat_stale_s
        skipped: list[str] = []
        if self._coord.clock.mono() - self._started_mono >= wait_s:
            skipped = await store.workflow_skip_absent(wait_s, stale_s)
        if skipped:
            logger.warning("skipped %d workflow node(s): no worker offers their capability",
                           len(skipped), extra={"action": "worker_absent", "n": len(skipped)})
        ended = await store.workflow_settle_running()
        fired = await store.schedule_fire_due(due_slots, self._plan_slot)
        for name, slot, wid, passed, error in fired:
            missed = f"; {passed} missed slot(s) before it not run" if passed else ""
            if error is not None:
                logger.error("schedule %s: slot %.0f not started: %s%s", name, slot, error,
                             missed, extra={"action": "schedule_failed"})
            else:
                logger.info("schedule %s: slot %.0f -> workflow %s%s", name, slot,
                            wid or "(already started)", missed,
                            extra={"action": "schedule_fire", "workflow_id": wid})
        return len(skipped), ended, sum(1 for f in fired if f[2] is not None)
