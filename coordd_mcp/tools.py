"""The MCP tools: a JSON schema, a one-line description and a coroutine per tool.

Arguments are checked against the tool's schema here (every field named in the error, no
unknown fields), before anything reaches coordd; coordd then validates them again like any
other request. Every failure becomes an MCP tool error (`isError`) whose text starts with
a stable code: coordd's own (`bad_request`, `permission_denied`, `not_found`, ...) or
`disconnected` when coordd is not running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import jsonschema
import msgspec

from coordd import errors
from coordd.client import Client
from coordd.config_defaults import MESSAGE_VISIBILITY_MAX_S
from coordd.rules.limits import UNITS_MAX as LIMIT_UNITS_MAX
from coordd.wire.protocol import JOB_STATUSES, TERMINAL_STATUSES
from coordd.wire.workflows import EDGE_POLICIES
from coordd.rules.resources import MAX as RESOURCES_MAX
from coordd.rules.times import DELAY_MAX_S, DURATION_MAX_S, TIME_MAX_S, TIME_MIN_S

WAIT_MAX_S = 300.0  # wait_for_job never holds a call longer (MCP clients time out calls)
WAIT_DEFAULT_S = 30.0
WAIT_POLL_S = 0.2
LIST_LIMIT_MAX = 200

Handler = Callable[[Client, str, dict[str, Any]], Awaitable[Any]]

_NAME = {"type": "string", "minLength": 1, "maxLength": 200}
_PRIORITY = {"type": "integer", "minimum": 0, "maximum": 3}
_JOB_ID = {"type": "object", "properties": {"job_id": {**_NAME, "description": "the job's id"}},
           "required": ["job_id"], "additionalProperties": False}
_MESSAGE_FIELDS = {
    "content": {"description": "the message: text or any JSON value"},
    "message_type": {"type": "string", "minLength": 1, "maxLength": 64, "default": "text",
                     "description": "a label the reader can branch on, e.g. request, reply"},
    "priority": {**_PRIORITY, "default": 2, "description": "0 = urgent .. 3; read P0 first"},
    "metadata": {"type": "object", "description": "free-form JSON object"},
    "ttl_s": {"type": "number", "exclusiveMinimum": 0, "maximum": DELAY_MAX_S,
              "description": "never delivered after this many seconds"},
    "message_id": {**_NAME, "description": "your own id: a resend with it is stored once"},
}
_RESOURCES = {  # coordd.rules.resources.Request: what a job asks of its worker
    "type": "object", "additionalProperties": False,
    "description": "GPUs, MiB of VRAM on each (implies 1 GPU), MiB of RAM the job needs",
    "properties": {key: {"type": "integer", "minimum": 0, "maximum": top}
                   for key, top in RESOURCES_MAX.items()}}
_LIMITS = {  # protocol.Enqueue.limits: names or {name, units}; coordd checks the names
    "type": "array",
    "description": "fleet-wide limits the job consumes: names, or {name, units} (units "
                   f"1..{LIMIT_UNITS_MAX}, default 1); [] = none; omit for its kind's default",
    "items": {"anyOf": [_NAME, {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {"name": _NAME, "units": {"type": "integer", "minimum": 1,
                                                "maximum": LIMIT_UNITS_MAX, "default": 1}}}]}}
_WORKFLOW_ID = {"type": "object", "required": ["workflow_id"], "additionalProperties": False,
                "properties": {"workflow_id": {**_NAME, "description": "the workflow's id"}}}
_NODE = {  # coordd.wire.workflows.WorkflowNode: a node of a graph (docs/concepts/workflows.md)
    "type": "object", "additionalProperties": False, "required": ["name", "kind", "required_role"],
    "properties": {
        "name": {**_NAME, "description": "the node's name, unique in the graph"},
        "kind": {**_NAME, "description": "job kind: selects the model a worker runs"},
        "required_role": {**_NAME, "description": "the capability (worker role) it needs"},
        "priority": {**_PRIORITY, "default": 2},
        "payload": {"type": "object", "description": "the node's input (a JSON object)"},
        "needs": {"type": "array", "description": "dependencies: node names, or {node, policy}",
                  "items": {"anyOf": [_NAME, {
                      "type": "object", "additionalProperties": False, "required": ["node"],
                      "properties": {"node": _NAME, "policy": {"enum": list(EDGE_POLICIES)}}}]}},
        "max_attempts": {"type": "integer", "minimum": 1},
        "max_runtime_s": {"type": "number", "exclusiveMinimum": 0},
        "result_schema": {**_NAME, "description": "check the result against it, e.g. claims"},
        "gates": {"type": "object", "description": "gate overrides, as for enqueue"},
        "resources": _RESOURCES, "limits": _LIMITS}}


@dataclass(frozen=True)
class Tool:
    """One MCP tool."""

    name: str
    description: str
    schema: dict[str, Any]
    handler: Handler
    read_only: bool = False


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


def _plain(value: Any) -> Any:
    """`value` as JSON builtins; a stored number JSON cannot hold (NaN, an infinite time)
    becomes null, so the text and the structured content of a reply agree and parse."""
    try:
        return msgspec.json.decode(msgspec.json.encode(value))
    except (msgspec.DecodeError, msgspec.EncodeError, RecursionError, ValueError):
        return msgspec.to_builtins(value)


async def enqueue_job(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.enqueue(**{"payload": {}, **a}))


async def get_job(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.get_job(a["job_id"]))


async def list_jobs(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.list_jobs(**{"limit": 20, **a}))


async def cancel_job(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return {"job_id": a["job_id"], **_plain(await c.cancel(a["job_id"]))}


async def wait_for_job(c: Client, agent: str, a: dict[str, Any]) -> Any:
    """Wait (coordd's `wait_job`) until the job is terminal or the (capped) timeout
    passes; never an error on timeout: the reply says `terminal: false` and the job's
    current state. Against an older coordd (unknown_method) it polls."""
    timeout = min(float(a.get("timeout_s", WAIT_DEFAULT_S)), WAIT_MAX_S)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            got = await c.wait_job(a["job_id"], max(0.0, deadline - loop.time()))
            if got.terminal or loop.time() >= deadline:
                return {"terminal": got.terminal, "job": _plain(got.job)}
    except (errors.UnknownMethod, errors.Overloaded):
        pass  # an older coordd, or its cap on parked calls: poll
    while True:
        job = await c.get_job(a["job_id"])
        if job.status in TERMINAL_STATUSES or loop.time() >= deadline:
            return {"terminal": job.status in TERMINAL_STATUSES, "job": _plain(job)}
        await asyncio.sleep(min(WAIT_POLL_S, max(0.0, deadline - loop.time())))


async def coordinator_status(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.status())


async def retry_job(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return {"job_id": a["job_id"], **_plain(await c.retry(a["job_id"]))}


async def list_workers(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.workers())


async def submit_workflow(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.workflow_submit(a))


async def get_workflow(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.workflow_get(a["workflow_id"]))


async def send_message(c: Client, agent: str, a: dict[str, Any]) -> Any:
    """`to` names the recipient, as `coordctl msg send --to`; `recipient` is its alias."""
    to, alias = a.pop("to", None), a.pop("recipient", None)
    if to is None and alias is None:
        raise ToolFailure("bad_request", "send_message: 'to' is a required property")
    if to is not None and alias is not None and to != alias:
        raise ToolFailure("bad_request", f"send_message: to {to!r} and its alias recipient "
                          f"{alias!r} name different agents")
    return _plain(await c.send_message(agent, to if to is not None else alias, **a))


async def broadcast(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.broadcast(agent, **a))


async def read_messages(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return {"reader": agent, **_plain(await c.read_messages(agent, **a))}


async def ack_messages(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.ack_messages(agent, a["message_ids"]))


async def get_agent_status(c: Client, agent: str, a: dict[str, Any]) -> Any:
    page = {k: a[k] for k in ("limit", "after") if k in a}
    return _plain(await c.get_agent_status(a.get("name"), **page))


async def update_agent_status(c: Client, agent: str, a: dict[str, Any]) -> Any:
    return _plain(await c.update_agent_status(agent, a["status"], a.get("metadata")))


TOOLS: tuple[Tool, ...] = (
    Tool("enqueue_job", "Add a job to coordd's queue; returns its job_id (admin uids only).",
         _obj({"kind": {**_NAME, "description": "job kind: selects the model a worker runs"},
               "required_role": {**_NAME, "description": "worker role needed, e.g. cpu"},
               "priority": {**_PRIORITY, "description": "0 = a user waits .. 3 = idle work"},
               "payload": {"description": "the job's input, any JSON value"},
               "run_at": {"type": "number", "minimum": TIME_MIN_S, "maximum": TIME_MAX_S,
                          "description": "not before (Unix seconds, 1970..2100)"},
               "max_attempts": {"type": "integer", "minimum": 1,
                                "description": "attempts before the job fails for good"},
               "idempotency_key": {**_NAME, "description": "a repeat returns the same job"},
               "max_runtime_s": {"type": "number", "exclusiveMinimum": 0,
                                 "maximum": DURATION_MAX_S,
                                 "description": "coordd refuses renewals past this"},
               "gates": {"type": "object", "description": "gate overrides for this job "
                         "(keys of coordd's [gates.pN] tables, e.g. max_memory_pct)"},
               "result_schema": {**_NAME, "description": "check the result against it, "
                                 "e.g. claims"},
               "delay_s": {"type": "number", "minimum": 0, "maximum": DELAY_MAX_S,
                           "description": "not before coordd's now + this (instead of run_at)"},
               "resources": _RESOURCES, "limits": _LIMITS},
              ("kind", "required_role", "priority")), enqueue_job),
    Tool("get_job", "Show one job: status, attempts, lease, result, error and event log.",
         _JOB_ID, get_job, read_only=True),
    Tool("list_jobs", "List jobs, oldest first, filtered by status, kind, role or priority.",
         _obj({"status": {"enum": list(JOB_STATUSES), "description": "only jobs in it"},
               "kind": {**_NAME, "description": "only jobs of this kind"},
               "role": {**_NAME, "description": "only jobs needing this worker role"},
               "priority": {**_PRIORITY, "description": "only jobs of this priority"},
               "limit": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX,
                         "default": 20, "description": "jobs per page"},
               "after": {**_NAME, "description": "the next_after of the previous page"},
               "newest_first": {"type": "boolean", "default": False,
                                "description": "newest first instead of oldest"}}), list_jobs,
         read_only=True),
    Tool("cancel_job", "Cancel a job (a running one stops at its next lease renewal).",
         _JOB_ID, cancel_job),
    Tool("retry_job", "Put a failed, cancelled or skipped job back to waiting with a fresh "
         "attempt budget (admin uids only).", _JOB_ID, retry_job),
    Tool("list_workers", "List workers: roles, heartbeat age, live, readings, leases and "
         "each priority's gate verdict.", _obj({}), list_workers, read_only=True),
    Tool("submit_workflow", "Submit a graph of jobs (nodes with needs) in one transaction; "
         "returns the workflow id and each node's job id (admin uids only).",
         _obj({"name": {**_NAME, "description": "the workflow's name"},
               "nodes": {"type": "array", "minItems": 1, "maxItems": 1000, "items": _NODE,
                         "description": "the graph's nodes"},
               "idempotency_key": {**_NAME, "description": "a repeat returns the same workflow"}},
              ("name", "nodes")), submit_workflow),
    Tool("get_workflow", "Show one workflow: its state, summary and every node's job state.",
         _WORKFLOW_ID, get_workflow, read_only=True),
    Tool("wait_for_job", f"Wait up to timeout_s (max {WAIT_MAX_S:g}) for a job to finish; "
         "returns it and whether it is terminal.",
         _obj({"job_id": {**_NAME, "description": "the job's id"},
               "timeout_s": {"type": "number", "minimum": 0, "maximum": WAIT_MAX_S,
                             "default": WAIT_DEFAULT_S,
                             "description": "seconds to wait at most (0: look once)"}},
              ("job_id",)), wait_for_job,
         read_only=True),
    Tool("coordinator_status", "Counts of workers, leases and jobs by status, with warnings.",
         _obj({}), coordinator_status, read_only=True),
    Tool("send_message", "Send a message from this agent to another agent by name (`to`).",
         _obj({"to": {**_NAME, "description": "the receiving agent's name"},
               "recipient": {**_NAME, "description": "alias of `to`"},
               **_MESSAGE_FIELDS}, ("content",)), send_message),
    Tool("read_messages", "Read this agent's messages (P0 first, then oldest); ack handled "
         "ids via `ack` or they come back after the visibility timeout.",
         _obj({"limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10,
                         "description": "messages at most (a reply also stops at 4 MiB)"},
               "ack": {"type": "array", "items": _NAME, "maxItems": 1000,
                       "description": "ids of messages handled since the last read"},
               "ack_on_read": {"type": "boolean", "default": False,
                               "description": "mark these processed now (at most once)"},
               "visibility_s": {"type": "number", "exclusiveMinimum": 0,
                                "maximum": MESSAGE_VISIBILITY_MAX_S,
                                "description": "unacked messages come back after this"}}),
         read_messages),
    Tool("ack_messages", "Mark messages handled so they are never delivered to this agent again.",
         _obj({"message_ids": {"type": "array", "items": _NAME, "minItems": 1,
                               "maxItems": 1000,
                               "description": "ids of the messages this agent handled"}},
              ("message_ids",)), ack_messages),
    Tool("broadcast", "Send a message every other agent reads once.",
         _obj(dict(_MESSAGE_FIELDS), ("content",)), broadcast),
    Tool("get_agent_status", "Show agents' status, heartbeat age, liveness and unread count "
         "(one by name, or a page of all).",
         _obj({"name": {**_NAME, "description": "one agent; omit for a page of all agents"},
               "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100,
                         "description": "agents per page"},
               "after": {**_NAME, "description": "the next_after of the previous page"}}),
         get_agent_status, read_only=True),
    Tool("update_agent_status", "Set this agent's status (and metadata); also its heartbeat.",
         _obj({"status": {"type": "string", "minLength": 1, "maxLength": 64,
                          "description": "e.g. idle, busy, blocked"},
               "metadata": {"type": "object", "description": "free-form JSON object, at most "
                            "16 KiB (omit to keep the stored one)"}},
              ("status",)), update_agent_status),
)
BY_NAME = {t.name: t for t in TOOLS}

# JSON Schema counts 1.0 as an integer; coordd's wire types do not, so the schema says
# integer and means it (1.0 is refused here with the field named, as coordd would).
_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool)))


class ToolFailure(Exception):
    """A tool call that failed; `text` is what the MCP client sees (code first)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.text = f"{code}: {message}"


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> None:
    """Validate `arguments` against the tool's schema.

    Raises:
        ToolFailure: `bad_request` naming the field and what is wrong with it.
    """
    validator = _Validator(tool.schema)
    errs = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if errs:
        parts = []
        for e in errs[:5]:
            where = ".".join(str(p) for p in e.absolute_path)
            parts.append(f"{where}: {e.message}" if where else e.message)
        raise ToolFailure("bad_request", f"{tool.name}: " + "; ".join(parts))


async def call(client: Client, agent: str, name: str, arguments: dict[str, Any] | None) -> Any:
    """Run tool `name`; return its JSON-compatible result.

    Raises:
        ToolFailure: unknown tool, bad arguments, or coordd's error (with its code).
    """
    tool = BY_NAME.get(name)
    if tool is None:
        raise ToolFailure("unknown_method", f"no tool named {name!r}")
    args = dict(arguments or {})
    check_arguments(tool, args)
    try:
        return await tool.handler(client, agent, args)
    except errors.CoordError as exc:
        raise ToolFailure(exc.code, exc.message) from exc

