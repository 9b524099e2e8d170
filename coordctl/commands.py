"""coordctl commands: each turns parsed arguments into one RPC (or a local file check) and
returns an `Outcome`: what `--json` prints, how to print it for humans, and whether it
failed. Parsing of user input (JSON payloads, files, times: coordctl.inputs) raises
`UsageError` before anything is sent.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from coordctl import paging
from coordctl.inputs import (  # noqa: F401  (also imported from here by other commands)
    UsageError, job_fields, loads_strict, parse_json_arg, parse_time_arg, read_batch,
    read_batch_lines, read_text_arg, to_enqueue,
)
from coordd.store.sqlite.offline import check_file  # offline admin (pyproject: clients)
from coordd.errors import CoordError
from coordd.wire.protocol import JobList, JobView, StatusReply

STATUS_WAITING_SHOWN = 10
LIST_ALL_PAGE_DEFAULT = 500
BATCH_ITEM = re.compile(r"jobs\[(\d+)\]: ")  # how coordd names a job of a batch in an error


class Outcome(NamedTuple):
    """A command's result.

    Attributes:
        data: what `--json` prints (a Struct, dict or list).
        human: prints the human form to a rich Console, or a plain string to print.
        failure: `(code, message)` when the operation failed after all (exit 1).
        after: runs once the output is written and flushed (`msg read` acks there), and
            not at all if writing it failed.
        stream: when set, prints the output itself (`stream(as_json)`), fetching as it
            goes, instead of `data` / `human`.
    """

    data: Any
    human: Callable[[Any], None] | str
    failure: tuple[str, str] | None = None
    after: Callable[[], None] | None = None
    stream: Callable[[bool], None] | None = None  # prints itself, page by page (--all)


# ---------------------------------------------------------------- commands


def status(client: Any, args: argparse.Namespace) -> Outcome:
    """`status`: counts, sizes, warnings and the oldest waiting jobs with their reasons."""
    from coordctl import render
    st: StatusReply = client.status()
    waiting = [{"job_id": w.job_id, "kind": w.kind, "required_role": w.required_role,
                "priority": w.priority, "age_s": w.waited_s, "waiting_reason": w.reason}
               for w in st.waiting]  # the oldest due ones of each priority, P0 first
    if st.jobs.get("waiting", 0) and not waiting:  # none due yet, or an older coordd
        waiting = [{"job_id": j.job_id, "kind": j.kind, "required_role": j.required_role,
                    "priority": j.priority, "age_s": j.age_s,
                    "waiting_reason": j.waiting_reason}
                   for j in client.list_jobs(status="waiting",
                                             limit=STATUS_WAITING_SHOWN).jobs]
    warnings = list(st.warnings)
    if st.jobs.get("waiting", 0) and st.workers_live == 0:
        warnings.append(f"{st.jobs['waiting']} job(s) waiting and no live worker")
    data = msgspec.structs.asdict(st)
    data["warnings"] = warnings
    data["oldest_waiting"] = waiting
    return Outcome(data, lambda con: render.status(con, st, waiting, warnings))


def enqueue(client: Any, args: argparse.Namespace) -> Outcome:
    """`enqueue`: one job from flags, or `--batch FILE.jsonl` in one transaction."""
    fields = job_fields(args)
    if args.batch is not None and getattr(args, "wait", False):
        raise UsageError("--wait takes one job, not --batch")
    if args.batch is not None:
        lines = read_batch_lines(args.batch, fields)
        try:
            res = client.enqueue_batch([msgspec.to_builtins(j) for _n, j in lines])
        except CoordError as exc:  # `jobs[i]: ...` -> the line of the file it came from
            m = BATCH_ITEM.match(exc.message)
            if m is None or int(m.group(1)) >= len(lines):
                raise
            err = type(exc)(f"--batch {args.batch} line {lines[int(m.group(1))][0]}: "
                            f"{exc.message[m.end():]}")
            err.code = exc.code
            raise err from None
        return Outcome(res, "\n".join(j.job_id + ("" if j.created else " (already enqueued)")
                                      for j in res.jobs))
    missing = [flag for flag, key in (("--kind", "kind"), ("--role", "required_role"),
                                      ("--priority", "priority"), ("--payload", "payload"))
               if key not in fields]
    if missing:
        raise UsageError(f"enqueue needs {', '.join(missing)} (or --batch FILE)")
    job = to_enqueue(fields, "enqueue")
    res = client.enqueue(**msgspec.structs.asdict(job))
    if getattr(args, "wait", False):
        return _wait(client, res.job_id, args.timeout)
    return Outcome(res, res.job_id + ("" if res.created else " (already enqueued)"))


WAIT_FOREVER_S = 10.0 ** 9  # `enqueue --wait` without --timeout


def _wait(client: Any, job_id: str, timeout: float | None) -> Outcome:
    """Wait for the job to end (coordd's `wait_job`, chunked by Client.wait_for); print
    its id and result; fail (exit 1) unless it succeeded."""
    from coordd.client import CallTimeout
    try:
        view: JobView = client.wait_for(job_id, timeout or WAIT_FOREVER_S)
    except CallTimeout as exc:
        return Outcome({"job_id": job_id, "terminal": False}, job_id,
                       failure=("timeout", exc.message))
    text = json.dumps(view.result, ensure_ascii=False) if view.result is not None else ""
    failure = None
    if view.status != "succeeded":
        failure = (view.status, f"job {job_id} {view.status}: {view.last_error or ''}".rstrip(": "))
    return Outcome(view, f"{job_id}\n{text}".rstrip("\n"), failure=failure)


def list_jobs(client: Any, args: argparse.Namespace) -> Outcome:
    """`list`: one page of jobs (or every page with `--all`) as a table."""
    from coordctl import render
    filters = {k: getattr(args, k) for k in ("status", "kind", "role", "priority")
               if getattr(args, k) is not None}
    limit = args.limit if args.limit is not None else (LIST_ALL_PAGE_DEFAULT if args.all else 50)
    after = resolve_job_id(client, args.after) if args.after is not None else None
    if args.all:  # page by page: printed as each page comes (coordctl.paging)
        def stream(as_json: bool) -> None:
            walk = paging.pages(
                lambda at: client.list_jobs(**filters, limit=limit, after=at), after)
            if as_json:
                return paging.stream_json(walk)
            con = render.make_console()
            paging.stream_table(walk, lambda jobs, first: render.job_rows(
                con, jobs, header=first, aligned=True), lambda n: con.print(f"{n} job(s)"))
        return Outcome(None, "", stream=stream)
    page: JobList = client.list_jobs(**filters, limit=limit, after=after)
    return Outcome(page, lambda con: render.job_list(con, page, args.all))


JOB_ID_HELP = "a job id or a unique start of one"
"""The help of every job ID argument: each is resolved by `resolve_job_id`."""


def resolve_job_id(client: Any, given: str) -> str:
    """The whole id of the job `given` is, or is the unique start of, through coordd's
    get_job prefix lookup (as `show` takes it), for commands that then act on that id.

    Raises:
        NotFound: no job id is or starts with it.
        BadRequest: several job ids start with it (a few are named).
    """
    return client.get_job(given, prefix=True).job_id


def show(client: Any, args: argparse.Namespace) -> Outcome:
    """`show ID`: the job, its lease, blobs and event log (ID may be a unique prefix)."""
    from coordctl import render
    job: JobView = client.get_job(args.job_id, prefix=True)
    return Outcome(job, lambda con: render.job(con, job))


def cancel(client: Any, args: argparse.Namespace) -> Outcome:
    """`cancel ID` (ID may be a unique prefix): print the job's status afterwards; a
    running job is told to stop ("cancel requested": its holder is told at once by its
    control watch, else at its next renew or heartbeat)."""
    job_id = resolve_job_id(client, args.job_id)
    res = client.cancel(job_id)
    if res.status == "running":
        return Outcome(res, f"{job_id}: cancel requested (running: its worker is told "
                            f"at once and stops it)")
    return Outcome(res, f"{job_id}: {res.status}")


def retry(client: Any, args: argparse.Namespace) -> Outcome:
    """`retry ID` (ID may be a unique prefix): put a failed, cancelled or skipped job back
    to waiting (coordd.rules.transitions.retry); print its status."""
    job_id = resolve_job_id(client, args.job_id)
    res = client.retry(job_id)
    return Outcome(res, f"{job_id}: {res.status}")


def reap(client: Any, args: argparse.Namespace) -> Outcome:
    """`reap`: reap expired leases now; print how many."""
    res = client.reap()
    return Outcome(res, f"reaped {res.reaped} expired lease(s)")


def workers(client: Any, args: argparse.Namespace) -> Outcome:
    """`workers`: readings, liveness, leases, broken kinds and gate verdicts per priority;
    `--forget ID [--force]` drops a dead worker instead."""
    from coordctl import render
    if args.forget is not None:
        gone = client.forget_worker(args.forget, force=args.force)
        ended = f"; lease(s) ended (worker_lost): {', '.join(gone.released)}" \
            if gone.released else ""
        return Outcome(gone, f"worker {args.forget} forgotten{ended}")
    if args.force:
        raise UsageError("--force goes with --forget ID")
    res = client.workers()
    return Outcome(res, lambda con: render.workers(con, res))


def metrics(client: Any, args: argparse.Namespace) -> Outcome:
    """`metrics`: the Prometheus text exposition (with --json: {"text": ...})."""
    res = client.metrics()
    return Outcome(res, res.text.rstrip("\n"))


def backup(client: Any, args: argparse.Namespace) -> Outcome:
    """`backup DEST`: coordd writes a verified copy at DEST (made absolute here)."""
    dest = os.path.abspath(os.path.expanduser(args.dest))
    res = client.backup(dest)
    line = (f"backup written to {res.path} ({res.bytes} bytes, {res.jobs} jobs); "
            f"quick_check: {res.quick_check}")
    if res.artifacts or res.missing_artifacts:
        line += (f"\nartifacts: {res.artifacts} copied to {res.path}.artifacts, "
                 f"{len(res.missing_artifacts)} missing; manifest: {res.manifest}")
    failure = None
    if res.quick_check != "ok":
        failure = ("check_failed", f"backup copy {res.path} failed quick_check: {res.quick_check}")
    elif res.missing_artifacts:
        failure = ("artifacts_missing", missing_artifacts_message(res))
    return Outcome(res, line, failure)


def missing_artifacts_message(res: Any) -> str:
    """The `artifacts_missing` line of a BackupResult: the files not copied, grouped by
    why (unreadable by coordd, absent, damaged...), a few ids each."""
    by_reason: dict[str, list[str]] = {}
    for sha in res.missing_artifacts:  # a coordd before missing_reasons: the old wording
        by_reason.setdefault(res.missing_reasons.get(sha, "absent or damaged"), []).append(sha)
    parts = [f"{len(shas)} {why}: {', '.join(shas[:3])}{', ...' if len(shas) > 3 else ''}"
             for why, shas in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))]
    text = (f"{len(res.missing_artifacts)} referenced artifact file(s) not copied: "
            + "; ".join(parts))
    if any(why.startswith("unreadable") for why in by_reason):
        text += (" (coordd cannot read files the workers wrote: the artifact store's files "
                 "must be group-readable and its folders group-writable for coordd's group; "
                 "docs/guides/systemd.md)")
    return text


def top(client: Any, args: argparse.Namespace) -> Outcome:
    """`top [--interval S] [--once]`: the live view (see coordctl.top)."""
    from coordctl import render
    from coordctl import top as top_mod
    from coordd.errors import UnknownMethod
    try:
        if args.json:  # one frame, as data
            return Outcome(top_mod.frame(client, args.interval)[1], "")
        data = top_mod.run(client, render.make_console(), args.interval, args.once)
    except UnknownMethod as exc:  # e.g. the PostgreSQL store serves no `workers` yet
        raise UnknownMethod(f"top: not available from this coordd: it needs the worker "
                            f"list ({exc.message}); coordctl status and coordctl list "
                            "work there") from exc
    return Outcome(data, "")


def restore(client: Any, args: argparse.Namespace) -> Outcome:
    """`restore SRC [--db PATH]`: verify a backup (quick_check, every sha256) and install it
    as the database, with its artifacts beside it. coordd must be stopped; needs no socket."""
    from coordd.store.sqlite import offline as backup_mod  # restore, re-exported there
    from coordd.paths import artifact_dir_for, default_db_path
    db = os.path.abspath(os.path.expanduser(args.db or str(default_db_path())))
    try:
        res = backup_mod.restore(os.path.expanduser(args.src), db, artifact_dir_for(db))
    except OSError as exc:  # the lock file beside the database (permissions): not coordd
        raise backup_mod.RestoreRefused(
            f"restore to {db}: {exc.filename or db}: {exc.strerror or exc}; nothing was "
            "changed") from exc
    line = (f"restored {res['db']} ({res['jobs']} jobs, {res['artifacts']} artifacts) "
            f"from {os.path.abspath(args.src)}; quick_check and every sha256 verified")
    if res.get("replaced"):
        line += f"\nthe database it replaced is kept at {res['replaced']}"
    res["warning"] = backup_mod.ownership_problem(res["db"], artifact_dir_for(res["db"]))
    if res["warning"]:
        print(f"coordctl: warning: {res['warning']}", file=sys.stderr)
    return Outcome(res, line)


def _check_line(res: dict[str, Any]) -> str:
    line = (f"quick_check: {res.get('quick_check')}; "
            f"foreign key violations: {res.get('foreign_key_violations')}")
    if "jobs" in res:
        line += f"; jobs: {res['jobs']}"
    if "schema_version" in res:
        line += f"; schema version: {res['schema_version']}"
        if res["schema_version"] > res.get("schema_version_known", res["schema_version"]):
            line += f" (newer than this coordd's {res['schema_version_known']})"
    if res.get("invariants"):
        line += f"; broken invariants: {', '.join(res['invariants'])}"
    return (f"{res['path']}: " if "path" in res else "") + line


def _check_failure(res: dict[str, Any]) -> tuple[str, str] | None:
    if res.get("quick_check") != "ok" or res.get("foreign_key_violations") \
            or res.get("invariants"):
        return ("check_failed", _check_line(res))
    return None


def check(client: Any, args: argparse.Namespace) -> Outcome:
    """`check [PATH]`: integrity of the live DB (via coordd) or of a file (read-only here)."""
    if args.path is None:
        res = client.check()
        return Outcome(res, _check_line(res), _check_failure(res))
    try:
        res = check_file(args.path)
    except FileNotFoundError as exc:
        return Outcome({"path": args.path, "error": str(exc)}, "", ("not_found", str(exc)))
    except sqlite3.Error as exc:
        msg = f"{args.path}: not a readable SQLite database: {exc}"
        return Outcome({"path": args.path, "error": msg}, "", ("check_failed", msg))
    failure = _check_failure(res)
    if failure is None and "jobs" not in res:
        failure = ("check_failed", f"{res['path']}: not a coordd database (no jobs table)")
    return Outcome(res, _check_line(res), failure)


COMMANDS: dict[str, Callable[[Any, argparse.Namespace], Outcome]] = {
    "status": status, "enqueue": enqueue, "list": list_jobs, "show": show,
    "cancel": cancel, "retry": retry, "reap": reap, "workers": workers,
    "backup": backup, "check": check, "metrics": metrics, "restore": restore,
    "top": top,
}
"""Subcommand name -> implementation."""
