"""A workflow's settle: from its nodes' states and its edges, which blocked nodes are
promoted (with their dependencies' results in the payload) or skipped, and whether the
workflow has ended, with the operator's summary. Pure: a store reads the rows, calls
`settle`, and applies the steps with its own statements.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from coordd.rules.transitions.table import (
    BLOCKED, CANCELLED, FAILED, NODE_TERMINAL, PARTIAL, PROMOTED, SKIPPED, SKIPPED_DEP,
    SUCCEEDED, WAITING, WORKER_ABSENT, Transition,
)


class Node(msgspec.Struct):
    """A workflow node as settle reads it: (job_id, name, status, role, last_error)."""

    job_id: str
    name: str
    status: str
    role: str
    last_error: str | None


class NodeStep(msgspec.Struct, frozen=True, kw_only=True):
    """One node moved by settle. `t`: PROMOTED or SKIPPED_DEP. `reason`: the event's (and
    a skip's last_error). `inputs`: promoted: (name, job_id) of each succeeded
    dependency, whose results go in its payload; `missing`: names of the dependencies
    (policy `run`) that did not succeed."""

    job_id: str
    t: Transition
    reason: str
    inputs: tuple[tuple[str, str], ...] = ()
    missing: tuple[str, ...] = ()


class Settlement(msgspec.Struct, frozen=True):
    """What settle decided: the node `steps` to apply in order; `status`: the workflow's
    end (one of WORKFLOW_ENDS) when every node has ended, else None; its `summary`."""

    steps: list[NodeStep]
    status: str | None = None
    summary: dict[str, Any] | None = None


def settle(nodes: list[Node], edges: Iterable[tuple[str, str, str]]) -> Settlement:
    """Move a workflow forward as far as its nodes' states allow (pure; `nodes` in stored
    order are updated in place with the decided statuses).

    `edges`: (dependent job_id, dependency job_id, policy `skip` | `run`). Each blocked
    node whose dependencies have all ended is skipped (a dependency did not succeed and
    its edge's policy is `skip`; reason `dependency_<status>: <node>`) or promoted
    (dependencies met). Skips cascade. When every node has ended the workflow's status is
    `succeeded` (all nodes), `partial` (some), `cancelled` (every node cancelled), else
    `failed`.
    """
    by_id = {n.job_id: n for n in nodes}
    deps: dict[str, list[tuple[str, str]]] = {}
    for job_id, dep_id, policy in edges:
        deps.setdefault(job_id, []).append((dep_id, policy))
    steps: list[NodeStep] = []
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n.status != BLOCKED:
                continue
            mine = deps.get(n.job_id, [])
            if any(by_id[d].status not in NODE_TERMINAL for d, _ in mine):
                continue
            unmet = [(by_id[d], p) for d, p in mine if by_id[d].status != SUCCEEDED]
            fatal = next((d for d, p in unmet if p == "skip"), None)
            if fatal is not None:
                reason = f"dependency_{fatal.status}: {fatal.name}"
                steps.append(NodeStep(job_id=n.job_id, t=SKIPPED_DEP, reason=reason))
                n.status, n.last_error = SKIPPED, reason
            else:
                missing = tuple(d.name for d, _ in unmet)
                steps.append(NodeStep(
                    job_id=n.job_id, t=PROMOTED, missing=missing,
                    inputs=tuple((by_id[d].name, d) for d, _ in mine
                                 if by_id[d].status == SUCCEEDED),
                    reason="dependencies met" + (f"; running without {', '.join(missing)}"
                                                 if missing else "")))
                n.status = WAITING
            changed = True
    if any(n.status not in NODE_TERMINAL for n in nodes):
        return Settlement(steps)
    summary = summarize(nodes)
    ok = len(summary[SUCCEEDED])
    if ok == len(nodes):
        status = SUCCEEDED
    elif ok:
        status = PARTIAL
    else:  # nothing succeeded: cancelled if that is all that happened, else failed
        status = CANCELLED if len(summary[CANCELLED]) == len(nodes) else FAILED
    return Settlement(steps, status, summary)


def summarize(nodes: Iterable[Any]) -> dict[str, Any]:
    """The operator's to-do list: what succeeded, failed (with errors), was skipped (with
    reasons) or cancelled, and the roles no worker offered (`missing_roles`). `nodes`
    have name, status, role, last_error."""
    out: dict[str, Any] = {"succeeded": [], "failed": [], "skipped": [], "cancelled": [],
                           "missing_roles": []}
    for n in nodes:
        if n.status == SUCCEEDED:
            out["succeeded"].append(n.name)
        elif n.status in (FAILED, SKIPPED, CANCELLED):
            out[n.status].append({"node": n.name, "reason": n.last_error})
            if n.status == SKIPPED and (n.last_error or "").startswith(WORKER_ABSENT) \
                    and n.role not in out["missing_roles"]:
                out["missing_roles"].append(n.role)
    return out


def node_payload(payload: Any, inputs: Iterable[tuple[str, Any, dict[str, Any] | None]],
                 missing: Iterable[str]) -> dict[str, Any]:
    """A promoted node's payload: its own (a non-object is wrapped as {"payload": ...})
    with `inputs` (dependency name -> result), `input_artifacts` (name -> {sha256, size,
    path}, only those with one) and `missing_inputs` (names, only if any). `inputs`:
    (name, decoded result, artifact dict or None) per succeeded dependency."""
    if not isinstance(payload, dict):
        payload = {"payload": payload}
    got, arts = {}, {}
    for name, result, artifact in inputs:
        got[name] = result
        if artifact:
            arts[name] = artifact
    payload["inputs"] = got
    if arts:
        payload["input_artifacts"] = arts
    missing = list(missing)
    if missing:
        payload["missing_inputs"] = missing
    return payload


def absent_reason(role: str, waited_s: float, wait_s: float) -> str:
    """The reason (and last_error) of SKIPPED_ABSENT."""
    return f"{WORKER_ABSENT}: no live worker with role {role} for {waited_s:.0f}s (wait {wait_s:g}s)"
