"""Human output for coordctl: rich tables over the wire Structs. No I/O besides printing.

Every user-supplied string (kinds, errors, payloads) is printed with markup, emoji and
highlighting off, so brackets or colons in them come out as typed, and with control
characters escaped visibly (`safe`): a message or payload cannot move the cursor, clear
the screen, retitle the terminal or reverse the text around it. When stdout is not a
terminal the console is made wide, so tables stay one row per line for grep and less.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from coordd.wire.protocol import JOB_STATUSES, JobList, JobView, StatusReply, WorkersResult
from coordd.rules.times import fmt_time  # noqa: F401  (coordctl's views import it from here)

PIPE_WIDTH_DEFAULT = 200
# C0 but tab and newline, DEL, C1, and the bidirectional overrides/isolates/marks
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f"
                      "\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(value: Any) -> str:
    """`value` as text with every control character shown as an escape (ESC as `\\x1b`,
    U+202E as `\\u202e`); tab and newline stay. Use it on every string from the database."""
    return _CONTROL.sub(_escape, value if isinstance(value, str) else str(value))


class SafeConsole(Console):
    """A Console whose plain-string arguments go through `safe`."""

    def print(self, *objects: Any, **kw: Any) -> None:  # noqa: D102
        super().print(*(safe(o) if isinstance(o, str) else o for o in objects), **kw)


class SafeTable(Table):
    """A Table whose string cells go through `safe`."""

    def add_row(self, *cells: Any, **kw: Any) -> None:  # noqa: D102
        super().add_row(*(safe(c) if isinstance(c, str) else c for c in cells), **kw)
BLOB_CHARS_MAX = 4000
PRIORITIES_SHOWN = ("p0", "p1", "p2", "p3")


def make_console() -> Console:
    """Return the stdout console (plain and wide when stdout is not a terminal; COLUMNS,
    when a positive number, is its width)."""
    width = None  # on a terminal rich follows its size
    columns = os.environ.get("COLUMNS", "")
    if not (columns.isdigit() and int(columns) > 0):  # unset, 0 (rich: print nothing), junk
        width = PIPE_WIDTH_DEFAULT if not sys.stdout.isatty() else (
            shutil.get_terminal_size().columns if columns.isdigit() else None)
    return SafeConsole(width=width, markup=False, emoji=False, highlight=False,
                       soft_wrap=False)


def fmt_age(seconds: float | None) -> str:
    """Format a duration compactly: 42s, 3m12s, 5h04m, 2d03h ("-" for None). Never
    raises: NaN, an infinity or a value that is not a number is shown as it is."""
    if seconds is None:
        return "-"
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return f"{seconds!r}s"
    neg, s = seconds < 0, abs(seconds)
    if s < 60:
        out = f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    elif s < 3600:
        out = f"{int(s // 60)}m{int(s % 60):02d}s"
    elif s < 86400:
        out = f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    else:
        out = f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"
    return f"-{out}" if neg else out


def fmt_bytes(n: int) -> str:
    """Format a byte count with a binary unit."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # unreachable


def fmt_blob(value: Any) -> str:
    """Pretty JSON for payloads/results/checkpoints, cut at BLOB_CHARS_MAX characters."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) > BLOB_CHARS_MAX:
        text = text[:BLOB_CHARS_MAX] + f"\n... [{len(text) - BLOB_CHARS_MAX} more chars; use --json]"
    return text


def _kv_table(title: str | None = None) -> Table:
    t = SafeTable(title=title, show_header=False, box=box.SIMPLE, title_justify="left",
              show_edge=False)
    t.add_column("field", style="bold", no_wrap=True)
    t.add_column("value", overflow="fold")
    return t


ERROR_EXPLAINS = frozenset({"waiting", "failed", "cancelled", "skipped"})
"""States a job's last error can explain: back to waiting after a failure, release or lost
lease; ended by it. A running, blocked or succeeded job's last error is an earlier
attempt's (the next claim does not clear it) and says nothing about it now."""


def job_error(job: JobView) -> str:
    """The job's last error where it explains its current state, else ""."""
    return (job.last_error or "") if job.status in ERROR_EXPLAINS else ""


def job_note(job: JobView) -> str:
    """The one-line 'why' of a job: its waiting reason, else its last error where that
    explains its state (job_error)."""
    if job.status == "waiting" and job.waiting_reason:
        return job.waiting_reason
    return job_error(job)


# ---------------------------------------------------------------- status


def status(console: Console, st: StatusReply, waiting: list[dict[str, Any]],
           warnings: list[str]) -> None:
    """Print the status summary and the oldest waiting jobs with their reasons (`waiting`:
    `status --json`'s `oldest_waiting` entries)."""
    console.print(status_table(st, warnings))
    if waiting:
        w = SafeTable(title=f"oldest waiting jobs ({len(waiting)})", box=box.SIMPLE_HEAD,
                      show_edge=False, title_justify="left")
        for col in ("id", "kind", "role", "prio", "waited", "waiting reason"):
            w.add_column(col, no_wrap=col != "waiting reason",
                         overflow="fold" if col == "waiting reason" else "ellipsis")
        for j in waiting:
            w.add_row(j["job_id"], j["kind"], j["required_role"], f"P{j['priority']}",
                      fmt_age(j["age_s"]), j["waiting_reason"] or "")
        console.print(w)


def status_table(st: StatusReply, warnings: list[str]) -> Table:
    """The status summary as a two-column table."""
    t = _kv_table("coordd status")
    t.add_row("workers", f"{st.workers} ({st.workers_live} live)")
    t.add_row("active leases", str(st.active_leases))
    t.add_row("jobs", "  ".join(f"{s} {st.jobs.get(s, 0)}" for s in JOB_STATUSES))
    by_prio = st.waiting_by_priority or {}
    t.add_row("waiting by priority",
              "  ".join(f"{p.upper()} {by_prio.get(p, 0)}" for p in PRIORITIES_SHOWN))
    t.add_row("oldest runnable", fmt_age(st.oldest_waiting_age_s))  # since it became runnable
    if st.db_bytes or st.wal_bytes:  # a SQLite file is never empty
        wal = f" (WAL {fmt_bytes(st.wal_bytes)})" if st.wal_bytes else ""  # SQLite's alone
        t.add_row("database", fmt_bytes(st.db_bytes) + wal)
    else:  # a store that reports no size
        t.add_row("database", "size not reported by this store")
    t.add_row("warnings", "; ".join(warnings) if warnings else "none")
    return t


# ---------------------------------------------------------------- jobs


# the job table's columns and, for pages printed one after another, their least widths
JOB_COLUMNS = (("id", 16), ("kind", 12), ("role", 8), ("prio", 4), ("eff", 4),
               ("status", 9), ("attempts", 8), ("age", 6), ("worker", 8), ("lease left", 10),
               ("waiting reason / last error", 0))


def job_rows(console: Console, jobs: list[JobView], header: bool = True,
             aligned: bool = False) -> None:
    """Print jobs as a table (with `aligned`, columns at fixed least widths, so that
    pages printed one after another line up)."""
    t = SafeTable(box=box.SIMPLE_HEAD, show_edge=False, show_header=header)
    for col, width in JOB_COLUMNS:
        t.add_column(col, no_wrap=not col.startswith("waiting"), overflow="fold",
                     min_width=width if aligned and width else None)
    for j in jobs:
        t.add_row(j.job_id, j.kind, j.required_role, f"P{j.priority}",
                  f"P{j.effective_priority}", j.status, f"{j.attempts}/{j.max_attempts}",
                  fmt_age(j.age_s), j.lease.worker_id if j.lease else "-", lease_left(j),
                  job_note(j))
    console.print(t)


def job_list(console: Console, page: JobList, paged_all: bool) -> None:
    """Print a table of jobs; hint at the next page when there is one."""
    job_rows(console, page.jobs)
    tail = f"{len(page.jobs)} job(s)"
    if page.next_after and not paged_all:
        tail += f"; more after --after {page.next_after} (or use --all)"
    console.print(tail)


def lease_left(j: JobView) -> str:
    """The time left on the job's lease ("EXPIRED 3s ago" once past; "-" without one),
    on coordd's clock when it answered."""
    if j.lease is None:
        return "-"
    left = j.lease.expires_at - (j.created_at + j.age_s)
    return f"{fmt_age(left)}" if left > 0 else f"EXPIRED {fmt_age(-left)} ago"


def job(console: Console, j: JobView) -> None:
    """Print one job: its fields, lease, blobs and event log."""
    t = _kv_table(f"job {j.job_id}")
    t.add_row("kind", j.kind)
    t.add_row("role", j.required_role)
    prio = f"P{j.priority}"
    if j.effective_priority != j.priority:
        prio += f" (effective P{j.effective_priority})"
    t.add_row("priority", prio)
    t.add_row("status", j.status + (" (cancel requested)" if j.cancel_requested else ""))
    t.add_row("attempts", f"{j.attempts}/{j.max_attempts}"
              + (f" (+{j.preemptions} handed back, not counted)" if j.preemptions else ""))
    t.add_row("created", f"{fmt_time(j.created_at)} ({fmt_age(j.age_s)} ago)")
    t.add_row("updated", fmt_time(j.updated_at))
    t.add_row("run at", fmt_time(j.run_at))
    if j.finished_at is not None:
        t.add_row("finished", fmt_time(j.finished_at))
    if j.idempotency_key:
        t.add_row("idempotency key", j.idempotency_key)
    if j.workflow_id:
        t.add_row("workflow", f"{j.workflow_id}, node {j.node}")
    if j.result_schema:
        t.add_row("result schema", j.result_schema)
    if j.max_runtime_s is not None:
        t.add_row("max runtime", fmt_age(j.max_runtime_s))
    if j.limits:
        t.add_row("limits", ", ".join(u.name + (f" x{u.units}" if u.units != 1 else "")
                                      for u in j.limits))
    if j.lease is not None:
        left = lease_left(j)
        when = left if left.startswith("EXPIRED") else f"expires in {left}"
        t.add_row("lease", f"worker {j.lease.worker_id}, token {j.lease.token}, "
                           f"granted {fmt_time(j.lease.granted_at)}, {when}")
    if j.resources or j.granted:
        t.add_row("resources", job_resources(j))
    gov = j.lease.governance if j.lease is not None else None
    if gov is not None:
        t.add_row("governance", f"vacating ({gov.vacate_reason})" if gov.vacate_reason
                  else f"suspended since {fmt_time(gov.suspended_at)} ({gov.suspend_reason})"
                  + ("" if gov.resume_at is None else
                     f", resumes at {fmt_time(gov.resume_at)} if its gates stay open"))
    if j.waiting_reason:
        t.add_row("waiting reason", j.waiting_reason)
    if j.last_error:
        t.add_row("last error" if job_error(j) else "earlier attempt's error", j.last_error)
    if j.artifact is not None:
        t.add_row("artifact", f"{j.artifact.path} ({fmt_bytes(j.artifact.size)}, "
                              f"sha256 {j.artifact.sha256})")
    t.add_row("payload", fmt_blob(j.payload))
    if j.result is not None:
        t.add_row("result", fmt_blob(j.result))
    if j.checkpoint is not None:
        t.add_row("checkpoint", fmt_blob(j.checkpoint))
    console.print(t)
    ev = SafeTable(title="events", box=box.SIMPLE_HEAD, show_edge=False, title_justify="left")
    for col in ("at", "transition", "worker", "reason"):
        ev.add_column(col, no_wrap=col != "reason", overflow="fold")
    for e in j.events:
        ev.add_row(fmt_time(e.at), f"{e.from_status or '-'} -> {e.to_status}",
                   e.worker_id or "-", e.reason or "")
    console.print(ev)


# ---------------------------------------------------------------- workers


def _reading(readings: dict[str, Any], notes: list[str], key: str, note_prefix: str,
             fmt: Any) -> str:
    value = readings.get(key)
    if value is not None:
        try:
            return fmt(value)
        except (TypeError, ValueError):  # not a number (a hand-edited heartbeat)
            return f"{value!r} (not a number)"
    for n in notes:
        if n.startswith(note_prefix + ":"):
            return n.split(":", 1)[1].strip()
    return "unavailable"


def _power(readings: dict[str, Any]) -> str:
    pct = readings.get("battery_pct")
    suffix = f" ({pct:.0f}%)" if isinstance(pct, (int, float)) else ""
    return ("battery" if readings.get("on_battery") else "mains") + suffix


def workers(console: Console, res: WorkersResult) -> None:
    """Print each worker's liveness, readings, leases and per-priority gate verdicts."""
    console.print(workers_table(res) if res.workers else "no workers have sent a heartbeat")
    for w in res.workers:
        for kind, why in sorted(w.broken_kinds.items()):
            console.print(f"{w.worker_id}: kind {kind} not usable: {why}")
        for note in w.notes:  # coordd.rules.governance: suspended or vacating jobs
            if note.startswith("governance: "):
                console.print(f"{w.worker_id}: job {note.removeprefix('governance: ')}")
        for line in resource_lines(w.resources):
            console.print(f"{w.worker_id}: {line}")


def fmt_request(r: dict[str, Any]) -> str:
    """`gpus 1 (gpu0), vram 8000 MiB each, ram 2000 MiB` for a request or a grant."""
    gpus = r.get("gpus") or len(r.get("gpu_ids") or ())
    ids = ",".join(f"gpu{i}" for i in r.get("gpu_ids") or ())
    parts = [f"gpus {gpus}" + (f" ({ids})" if ids else "")] if gpus else []
    if r.get("vram_mb"):
        parts.append(f"vram {r['vram_mb']} MiB each")
    elif gpus:
        parts.append("whole")
    if r.get("ram_mb"):
        parts.append(f"ram {r['ram_mb']} MiB")
    return ", ".join(parts) or "none"


def job_resources(j: JobView) -> str:
    """A job's resource request and what its lease was granted: `gpus 1, vram 8000 MiB
    each (granted: gpus 1 (gpu0), ...)`; a grant from the kind's default (no request of
    its own) says so. "" for neither."""
    if not (j.resources or j.granted):
        return ""
    asked = fmt_request(j.resources) if j.resources else "none asked"
    if not j.granted:
        return asked
    whence = "granted" if j.resources else "granted by the kind's default"
    return f"{asked} ({whence}: {fmt_request(j.granted)})"


def resource_lines(res: dict[str, Any]) -> list[str]:
    """`workers`' lines for a worker's GPUs, RAM and reservations
    (coordd.rules.resources.summary)."""
    def mib(v: Any) -> str:
        return "?" if v is None else f"{v:.0f}"
    out = []
    for g in res.get("gpus", ()):
        temp = g.get("temperature_c")
        util = g.get("utilization_pct")
        out.append(f"gpu{g['index']}: {mib(g.get('memory_used_mb'))}/"
                   f"{mib(g.get('memory_total_mb'))} MiB used, {mib(g.get('held_mb'))} held, "
                   f"{mib(g.get('free_mb'))} free"
                   + ("" if temp is None else f", {temp:.0f}°C")
                   + ("" if util is None else f", {util:.0f}% busy"))
    ram = res.get("ram")
    if ram:
        out.append(f"ram: {mib(ram['capacity_mb'])} MiB, {mib(ram['held_mb'])} held, "
                   f"{mib(ram['free_mb'])} free")
    if res.get("reserved"):
        out.append("reserved for a waiting job: " + fmt_request(res["reserved"]))
    return out


def liveness(w: Any) -> str:
    """A WorkerView's `live` column: yes, offline (it said goodbye) or NO (silent)."""
    return "yes" if w.live else ("offline" if w.offline_at is not None else "NO")


def verdict_cells(w: Any) -> list[str]:
    """A WorkerView's gate verdict per shown priority: the gates that hold it (`ok`: none),
    `-` where it takes no such work; all `-` for a worker that is not live (its `live`
    column says why; a stale heartbeat in every column only widened the table)."""
    if not w.live:
        return ["-"] * len(PRIORITIES_SHOWN)
    return [",".join(w.verdicts.get(p, [])) or "ok" if p in w.verdicts else "-"
            for p in PRIORITIES_SHOWN]


def workers_table(res: WorkersResult) -> Table:
    """One row per worker: liveness, readings, leases and per-priority gate verdicts."""
    t = SafeTable(box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("worker", "roles", "heartbeat", "live", "mem %", "temp", "power",
                "user idle", "leases", *PRIORITIES_SHOWN):
        t.add_column(col, overflow="fold")
    for w in res.workers:
        r = w.readings
        mem = r.get("memory_used_pct")
        t.add_row(
            w.worker_id, ",".join(w.roles), f"{fmt_age(w.heartbeat_age_s)} ago",
            liveness(w),
            f"{mem:.0f}" if isinstance(mem, (int, float)) else "unavailable",
            _reading(r, w.notes, "temperature_c", "temperature", lambda v: f"{v:.0f}°C"),
            _reading(r, w.notes, "on_battery", "power", lambda _v: _power(r)),
            _reading(r, w.notes, "user_idle_s", "user idle", fmt_age),
            str(w.active_leases), *verdict_cells(w))
    return t
