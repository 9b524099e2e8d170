"""coordctl workflow and schedule commands (issue 8).

`workflow submit FILE` (a TOML or JSON graph), `workflow show ID` (a tree with each
node's state), `workflow list`, `workflow cancel ID`; `schedule add FILE [--cron EXPR]
[--name N] [--replace]`, `schedule list`, `schedule rm NAME|ID`. A graph file is a
`coordd.wire.workflows.WorkflowSubmit` (unknown keys are refused):

    name = "story"
    [[nodes]]
    name = "gather"
    kind = "gather"
    required_role = "gather"
    payload = { module = "json" }
    [[nodes]]
    name = "narrate"
    kind = "narrate"
    required_role = "narrate"
    needs = ["gather"]                              # policy "skip" (the default)
    [[nodes]]
    name = "build"
    kind = "build"
    required_role = "build"
    needs = ["narrate", { node = "gather", policy = "run" }]

A top-level `schedule = "CRON"` makes the file a recurring schedule's template (for
`schedule add`); `workflow submit` refuses such a file rather than run it once by surprise.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections.abc import Callable
from typing import Any

import msgspec

from coordctl.commands import Outcome, UsageError, loads_strict, read_text_arg
from coordd.conffile import locate
from coordd.errors import CoordError
from coordd.rules.times import fmt_time
from coordd.rules.values import check_finite
from coordd.wire.workflows import (
    LIST_LIMIT_MAX, WORKFLOW_STATUSES, ScheduleList, WorkflowSubmit, WorkflowView,
)

STATUS_STYLE = {"succeeded": "green", "failed": "red", "skipped": "yellow",
                "cancelled": "magenta", "running": "cyan", "waiting": "white",
                "blocked": "dim", "partial": "yellow"}


def read_graph(path: str) -> tuple[WorkflowSubmit, str | None]:
    """Read a graph file (TOML, or JSON when it ends in .json or starts with '{');
    return it and its `schedule` cron expression, if any.

    Raises:
        UsageError: unreadable, not TOML/JSON, or not a workflow.
    """
    text = read_text_arg(f"@{path}", "workflow file")
    try:
        if path.endswith(".json") or text.lstrip().startswith("{"):
            data = loads_strict(text)  # NaN and Infinity refused, as for --payload
        else:
            data = tomllib.loads(text)
        check_finite("workflow", data)  # TOML has nan and inf
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML or JSON: {exc}") from exc
    except (ValueError, CoordError) as exc:
        raise UsageError(f"{path}: {getattr(exc, 'message', exc)}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a workflow is a table with `name` and `nodes`")
    cron = data.pop("schedule", None)
    if cron is not None and not isinstance(cron, str):
        raise UsageError(f"{path}: `schedule` must be a cron expression string")
    try:
        return msgspec.convert(data, WorkflowSubmit), cron
    except msgspec.ValidationError as exc:
        raise UsageError(f"{path}: {locate(str(exc), data)}") from exc


def workflow(client: Any, args: argparse.Namespace) -> Outcome:
    """`workflow submit|show|list|cancel`."""
    if args.wf_command == "submit":
        spec, cron = read_graph(args.file)
        if cron is not None:
            raise UsageError(f"{args.file} has a `schedule`: add it with "
                             f"`coordctl schedule add {args.file}`")
        if args.key:
            spec.idempotency_key = args.key
        res = client.workflow_submit(spec)
        lines = [res.workflow_id + ("" if res.created else " (already submitted)")]
        lines += [f"  {name}: {job_id}" for name, job_id in res.jobs.items()]
        return Outcome(res, "\n".join(lines))
    if args.wf_command == "cancel":
        wf = client.workflow_cancel(args.workflow_id, prefix=True)
        return Outcome(wf, lambda con: con.print(tree(wf), summary_text(wf)))
    if args.wf_command == "show":
        wf: WorkflowView = client.workflow_get(args.workflow_id, prefix=True)
        return Outcome(wf, lambda con: con.print(tree(wf), summary_text(wf)))
    res = client.workflow_list(status=args.status, limit=args.limit)
    return Outcome(res, lambda con: con.print(list_table(res.workflows)))


def schedule(client: Any, args: argparse.Namespace) -> Outcome:
    """`schedule add|list|rm`."""
    if args.sc_command == "add":
        spec, cron = read_graph(args.file)
        cron = args.cron or cron
        if not cron:
            raise UsageError("schedule add needs --cron EXPR or `schedule` in the file")
        res = client.schedule_add(args.name or spec.name, cron, spec, replace=args.replace)
        note = "" if res.created else " (replaced)" if res.replaced else \
            " (exists, identical)"
        return Outcome(res, f"{res.name} ({res.schedule_id}){note}: {res.cron}, next "
                            f"{_utc(res.next_at)}")
    if args.sc_command == "rm":
        client.schedule_remove(args.name)
        return Outcome({"removed": args.name}, f"{args.name}: removed")
    res: ScheduleList = client.schedule_list()
    lines = [f"{s.name}  {s.cron!r}  workflow {s.workflow}  next {_utc(s.next_at)}  "
             f"last {_utc(s.last_slot)}  started {s.fired}" for s in res.schedules]
    return Outcome(res, "\n".join(lines) or "no schedules")


# ---------------------------------------------------------------- rendering


def _utc(ts: float | None) -> str:
    return fmt_time(ts)


def _styled(status: str) -> tuple[str, str]:
    return status, STATUS_STYLE.get(status, "white")


def tree(wf: WorkflowView) -> Any:
    """The graph as a rich Tree: each node under its first dependency, with its state.
    Text objects, not markup: names and reasons are user data (the console has markup off)."""
    from rich.text import Text
    from rich.tree import Tree
    root = Tree(Text.assemble(f"workflow {wf.workflow_id} ", (wf.name, "bold"), " ",
                              _styled(wf.status)))
    branches: dict[str, Any] = {}
    for n in wf.nodes:  # stored in topological order (dependencies first)
        parent = branches.get(n.needs[0].node, root) if n.needs else root
        line = Text.assemble((n.name, STATUS_STYLE.get(n.status, "white")), " ",
                             _styled(n.status),
                             f"  {n.kind} on role {n.required_role}  "
                             f"attempts {n.attempts}/{n.max_attempts}  ", (n.job_id, "dim"))
        if n.needs and n.needs[0].policy != "skip":
            line.append(f"  (runs without {n.needs[0].node} if it fails)", "dim")
        others = [d.node + ("" if d.policy == "skip" else f" ({d.policy})")
                  for d in n.needs[1:]]
        if others:
            line.append(f"  also needs {', '.join(others)}")
        if n.reason and n.status != "succeeded":
            line.append("\n" + n.reason[:300], "dim")
        branches[n.name] = parent.add(line)
    return root


def summary_text(wf: WorkflowView) -> str:
    """The summary of a finished workflow, or the counts of a running one."""
    if wf.summary is None:
        return "running: " + ", ".join(f"{s} {n}" for s, n in sorted(wf.counts.items()))
    s = wf.summary
    out = [f"succeeded: {', '.join(s['succeeded']) or '-'}"]
    for key in ("failed", "skipped", "cancelled"):
        for item in s.get(key, []):
            out.append(f"{key}: {item['node']} ({item.get('reason') or '-'})")
    if s.get("missing_roles"):
        out.append(f"capabilities to add (no worker offered them): "
                   f"{', '.join(s['missing_roles'])}")
    return "\n".join(out)


def list_table(wfs: list[WorkflowView]) -> Any:
    from rich.table import Table
    from rich.text import Text
    t = Table(box=None)
    for col in ("workflow", "name", "status", "nodes", "created", "finished"):
        t.add_column(col)
    for w in wfs:
        nodes = " ".join(f"{k} {v}" for k, v in sorted(w.counts.items()))
        t.add_row(w.workflow_id, w.name, Text(*_styled(w.status)), nodes,
                  _utc(w.created_at), _utc(w.finished_at))
    return t


def _limit(text: str) -> int:
    """argparse type: an int in 1..LIST_LIMIT_MAX."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= LIST_LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"must be 1..{LIST_LIMIT_MAX}, got {value}")
    return value


def add_parsers(cmd: Callable[[str, str], argparse.ArgumentParser],
                common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `workflow` and `schedule` with their subcommands (see the module docstring);
    `common` adds the global options to each, so they may follow the subcommand too."""
    def sub(group: Any, name: str, help_: str) -> argparse.ArgumentParser:
        sp = group.add_parser(name, help=help_, description=help_)
        common(sp)
        return sp

    ws = cmd("workflow", "graphs of jobs: submit FILE, show ID, list, cancel ID").add_subparsers(
        dest="wf_command", required=True, metavar="SUBCOMMAND")
    submit = sub(ws, "submit", "submit a graph from a TOML or JSON file")
    submit.add_argument("file", metavar="FILE")
    submit.add_argument("--key", metavar="IDEMPOTENCY_KEY",
                        help="a repeated key with the same graph returns the existing "
                             "workflow; with another graph it is refused")
    sub(ws, "show", "a tree of the nodes and their states").add_argument(
        "workflow_id", metavar="ID", help="a workflow id or a unique start of one")
    ls = sub(ws, "list", "workflows, newest first")
    ls.add_argument("--status", choices=WORKFLOW_STATUSES,
                    help="only workflows in this state")
    ls.add_argument("--limit", type=_limit, default=50, metavar="N",
                    help=f"at most N workflows, 1..{LIST_LIMIT_MAX} (default 50)")
    sub(ws, "cancel", "cancel every node that has not ended").add_argument(
        "workflow_id", metavar="ID", help="a workflow id or a unique start of one")
    ss = cmd("schedule", "recurring workflows: add FILE, list, rm NAME|ID").add_subparsers(
        dest="sc_command", required=True, metavar="SUBCOMMAND")
    add = sub(ss, "add", "start the file's workflow at every cron slot (UTC)")
    add.add_argument("file", metavar="FILE")
    add.add_argument("--cron", metavar="EXPR", help="5-field cron (default: the file's)")
    add.add_argument("--name", help="schedule name (default: the workflow's name)")
    add.add_argument("--replace", action="store_true",
                     help="if the name exists with another cron or workflow, update it "
                          "(without this, that is refused)")
    sub(ss, "list", "schedules and their next slot")
    sub(ss, "rm", "delete a schedule (by name or id; the workflows it started stay)"
        ).add_argument("name", metavar="NAME|ID", help="the schedule's name or id")


COMMANDS = {"workflow": workflow, "schedule": schedule}
