"""Wire Structs of the workflow and schedule methods (issue 8). Data only, no I/O.

Registered in coordd.wire.protocol's PARAMS and ADMIN_METHODS (kept apart for that module's
size). Self-contained (nothing imported from coordd.wire.protocol), so either module may be
imported first. Same evolution rules: new fields get defaults and go last; a field's type
never changes.

One exception to STYLE's "no forbid_unknown_fields on the wire": a graph (`WorkflowSubmit`,
its `WorkflowNode`s and `Need`s, and `ScheduleAdd` around it) refuses keys it does not
know, on both sides (coordctl reading the file, coordd decoding the request). A key
ignored there changes what runs: a typo `need = ["a"]` would run the node with no
dependency, `resultschema` would skip the check. The cost, an older coordd refusing a
graph that uses a newer field, is the safe outcome for the same reason.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.wire.limits import LimitUse


WORKFLOW_STATUSES = ("running", "succeeded", "partial", "failed", "cancelled")
LIST_LIMIT_MAX = 1000  # `workflow_list`: limit is 1..this
EDGE_POLICIES = ("skip", "run")  # a dependency that did not succeed: skip the node, or run it


class Need(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A dependency edge: `node` must end first; if it does not succeed, `policy` decides."""

    node: str
    policy: str = "skip"


class WorkflowNode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One node of a graph: a job routed by `required_role` (the capability it needs).

    `needs` lists dependency names (policy `skip`) or `{node, policy}` tables. The payload
    must be a table; the dependencies' results are added under `inputs` when it is queued.
    """

    name: str
    kind: str
    required_role: str
    priority: int = 2
    payload: dict[str, Any] = {}
    needs: list[str | Need] = []
    max_attempts: int | None = None
    max_runtime_s: float | None = None
    result_schema: str | None = None
    gates: dict[str, Any] | None = None
    resources: dict[str, Any] | None = None  # {gpus, vram_mb, ram_mb}, as for enqueue
    limits: list[str | LimitUse] | None = None  # fleet-wide limits (None: the kind's)


class WorkflowSubmit(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`workflow_submit`: a whole graph, queued in one transaction (or refused whole)."""

    name: str
    nodes: list[WorkflowNode]
    idempotency_key: str | None = None


class WorkflowSubmitResult(msgspec.Struct, kw_only=True):
    """`workflow_submit` result: node name -> job id; `created` False for a repeated key."""

    workflow_id: str
    created: bool
    jobs: dict[str, str]


class WorkflowId(msgspec.Struct, kw_only=True):
    """`workflow_get`, `workflow_cancel`: one workflow id; with `prefix`, `workflow_id` may
    be the start of one workflow's id."""

    workflow_id: str
    prefix: bool = False


class ListWorkflows(msgspec.Struct, kw_only=True):
    """`workflow_list`: newest first, optionally one status."""

    status: str | None = None
    limit: int = 100


class NeedView(msgspec.Struct, kw_only=True):
    """An edge as `workflow_get` shows it (a reply: unknown fields are ignored)."""

    node: str
    policy: str = "skip"


class NodeView(msgspec.Struct, kw_only=True):
    """A workflow node: its job's state, its edges, and why it ended where it did."""

    name: str
    job_id: str
    kind: str
    required_role: str
    status: str
    attempts: int
    max_attempts: int
    needs: "list[NeedView]" = []
    reason: str | None = None  # last error, skip reason
    result: Any = None
    artifact: "NodeArtifact | None" = None


class WorkflowView(msgspec.Struct, kw_only=True):
    """A workflow; `nodes` only from `workflow_get`, `counts` (nodes by status) from both."""

    workflow_id: str
    name: str
    status: str
    created_at: float
    updated_at: float
    finished_at: float | None = None
    summary: dict[str, Any] | None = None
    idempotency_key: str | None = None
    schedule_id: str | None = None
    counts: dict[str, int] = {}
    nodes: list[NodeView] = []


class WorkflowList(msgspec.Struct, kw_only=True):
    """`workflow_list` result."""

    workflows: list[WorkflowView]


class ScheduleAdd(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`schedule_add`: start `workflow` at every slot of the cron expression (UTC). A name
    in use with the same cron and workflow is a repeat (`created` False); with another,
    refused (`invalid_state`) unless `replace`."""

    name: str
    cron: str
    workflow: WorkflowSubmit
    replace: bool = False  # the name exists with another cron or workflow: take this one


class ScheduleName(msgspec.Struct, kw_only=True):
    """`schedule_remove`: a schedule's name (or id)."""

    name: str


class ScheduleView(msgspec.Struct, kw_only=True):
    """A recurring schedule: its next slot, the last slot started and how many were."""

    schedule_id: str
    name: str
    cron: str
    workflow: str
    next_at: float
    last_slot: float | None = None
    fired: int = 0
    created: bool = True  # `schedule_add`: False when the name existed
    replaced: bool = False  # `schedule_add` with `replace`: the existing one was updated


class ScheduleList(msgspec.Struct, kw_only=True):
    """`schedule_list` result."""

    schedules: list[ScheduleView]


class NoParams(msgspec.Struct):
    """`schedule_list`: no params (the same wire shape as coordd.wire.protocol.Empty)."""


class NodeArtifact(msgspec.Struct, kw_only=True):
    """A node's result file in the artifact store (the wire shape of protocol.ArtifactRef)."""

    sha256: str
    size: int
    path: str


WORKFLOW_PARAMS: dict[str, type[msgspec.Struct]] = {
    "workflow_submit": WorkflowSubmit,
    "workflow_get": WorkflowId,
    "workflow_list": ListWorkflows,
    "workflow_cancel": WorkflowId,
    "schedule_add": ScheduleAdd,
    "schedule_list": NoParams,
    "schedule_remove": ScheduleName,
}
"""The workflow methods and their params Structs (merged into protocol.PARAMS)."""

WORKFLOW_ADMIN_METHODS = frozenset({"workflow_submit", "workflow_cancel", "schedule_add",
                                    "schedule_remove"})
