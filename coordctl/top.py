"""`coordctl top`: a live view of coordd — queues, workers with readings and gate verdicts,
the oldest waiting jobs with why each waits, running jobs with the lease time left, recent
failures. Refreshes in place; `q` (on a terminal) or Ctrl-C quits. `--once` prints one
frame, without the refresh footer, and exits (for scripts and tests). Into a pipe or a
file it writes each frame after the last, one per interval.
The view fits the terminal: narrow, it drops columns by rank; short, it shows fewer rows
(`layout`); a line never wraps; below MIN_WIDTH x MIN_HEIGHT it is one line saying so.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coordctl import render
from coordd.wire.protocol import JOB_STATUSES

RUNNING_SHOWN = 15
FAILED_SHOWN = 5
TABLE_LINES = 3  # a table's title, header and the rule under it
GAP = 3  # between two columns: padding, divider, padding
FLEX_MIN = 12  # the flexible column (last error) keeps at least this many cells
MIN_WIDTH, MIN_HEIGHT = 40, 8  # below this the view is one line: "terminal too small"


@dataclass(frozen=True)
class Column:
    """A column of a view: `drop` ranks it (lowest dropped first when the width is short);
    a `flex` column is cut with an ellipsis to what is left instead of being dropped."""

    name: str
    drop: int
    flex: bool = False


def fitted(title: str, columns: list[Column], rows: list[list[str]], width: int) -> Table:
    """A table of `rows` no wider than `width` cells: columns dropped by rank until the rest
    fits, cells never wrapped (cut with an ellipsis at worst)."""
    rows = [[render.safe(c) for c in r] for r in rows]
    widths = [max([cell_len(col.name), *(cell_len(r[i]) for r in rows)])
              for i, col in enumerate(columns)]
    kept = list(range(len(columns)))

    def need() -> int:
        return sum(min(FLEX_MIN, widths[i]) if columns[i].flex else widths[i]
                   for i in kept) + GAP * (len(kept) - 1)
    for i in sorted(kept, key=lambda i: columns[i].drop):
        if need() <= width or len(kept) == 1:
            break
        if not columns[i].flex:
            kept.remove(i)
    others = sum(widths[i] for i in kept if not columns[i].flex) + GAP * (len(kept) - 1)
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False)
    for i in kept:
        col = columns[i]
        t.add_column(col.name, no_wrap=True, overflow="ellipsis",
                     max_width=max(1, width - others) if col.flex else None)
    for r in rows:
        t.add_row(*(r[i] for i in kept))
    return t


def _packed(fields: list[str], width: int) -> list[Text]:
    """`fields` joined by two spaces into lines of at most `width` cells (a field too long
    for a line of its own is cut)."""
    lines: list[str] = []
    for f in fields:
        if lines and cell_len(lines[-1]) + 2 + cell_len(f) <= width:
            lines[-1] += "  " + f
        else:
            lines.append(f)
    return [Text(render.safe(line), no_wrap=True, overflow="ellipsis") for line in lines]


def summary(st: Any, width: int) -> list[Text]:
    """The status line(s): counts, waiting by priority, sizes, warnings. Fields go most
    telling first (the queue, then running and failed), so a short view that keeps only
    the first line keeps those."""
    by_prio = st.waiting_by_priority or {}
    first = ("running", "failed")
    fields = ["coordd status",
              "waiting " + str(st.jobs.get("waiting", 0)) + " ("
              + " ".join(f"{p.upper()} {by_prio.get(p, 0)}" for p in render.PRIORITIES_SHOWN)
              + ")", f"oldest {render.fmt_age(st.oldest_waiting_age_s)}",
              *(f"{s} {st.jobs.get(s, 0)}" for s in first),
              f"workers {st.workers} ({st.workers_live} live)", f"leases {st.active_leases}",
              *(f"{s} {st.jobs.get(s, 0)}" for s in JOB_STATUSES
                if s != "waiting" and s not in first),
              f"db {render.fmt_bytes(st.db_bytes)} (WAL {render.fmt_bytes(st.wal_bytes)})"]
    lines = _packed(fields, width)
    lines.append(Text(render.safe("warnings: " + ("; ".join(st.warnings) or "none")),
                      no_wrap=True, overflow="ellipsis"))
    return lines


def layout(n_head: int, sizes: list[int], height: int | None
           ) -> tuple[int, list[bool], list[int]]:
    """Fit the view into `height` lines (None: any): return (head lines shown, whether each
    section is a table or one title line, rows shown per section).

    What is kept first: the footer, the first status line and one line per section
    (its title: "running (15, 0 shown)"); then the warnings line; then each section as
    a table with one row, in order; then the rest of the status lines; then more rows,
    section by section. A section of no rows costs its table's header only.
    """
    if height is None:
        return n_head, [True] * len(sizes), list(sizes)
    left = height - 2 - len(sizes)  # the footer, the first status line, a line per section
    head = 1
    if n_head > 1 and left >= 1:
        head, left = 2, left - 1  # the warnings line
    full, rows = [False] * len(sizes), [0] * len(sizes)
    for i, n in enumerate(sizes):
        cost = TABLE_LINES - 1 + min(n, 1)
        if cost <= left:
            full[i], rows[i], left = True, min(n, 1), left - cost
    more = max(0, min(n_head - head, left))
    head, left = head + more, left - more
    for i, n in enumerate(sizes):
        if full[i]:
            add = max(0, min(n - rows[i], left))
            rows[i], left = rows[i] + add, left - add
    return head, full, rows


def _title(name: str, total: int, shown: int) -> str:
    return f"{name} ({total})" if shown >= total else f"{name} ({total}, {shown} shown)"


WORKER_COLUMNS = [Column("worker", 99), Column("roles", 40), Column("heartbeat", 50),
                  Column("live", 90), Column("mem %", 60), Column("temp", 20),
                  Column("power", 10), Column("user idle", 30), Column("leases", 70),
                  Column("p0", 80), Column("p1", 25), Column("p2", 15), Column("p3", 55)]
WAITING_COLUMNS = [Column("id", 99), Column("kind", 40), Column("prio", 70),
                   Column("waited", 80), Column("why", 90, flex=True)]
RUNNING_COLUMNS = [Column("id", 99), Column("kind", 40), Column("prio", 30),
                   Column("worker", 60), Column("attempt", 10), Column("lease left", 80)]
FAILED_COLUMNS = [Column("id", 99), Column("kind", 40), Column("finished", 20),
                  Column("last error", 90, flex=True)]


def frame(client: Any, interval: float | None,
          size: tuple[int, int | None] = (render.PIPE_WIDTH_DEFAULT, None)
          ) -> tuple[Group, dict[str, Any]]:
    """Fetch one view (four RPCs) and return it as a renderable and as plain data.

    Args:
        interval: seconds between refreshes, said in the footer; None for a one-shot
            (`--once`): no footer, and its line holds the view.
        size: (width, height) in cells the view must fit (height None: any); columns are
            dropped by rank and rows left out (titles say how many are shown), never wrapped.
    """
    width, height = size
    st = client.status()
    ws = client.workers()
    running = client.list_jobs(status="running", limit=RUNNING_SHOWN).jobs
    failed = client.list_jobs(status="failed", limit=FAILED_SHOWN, newest_first=True).jobs
    data = {"status": st, "workers": ws.workers, "waiting": st.waiting, "running": running,
            "failed": failed}
    if width < MIN_WIDTH or (height is not None and height < MIN_HEIGHT):
        return Group(Text(f"terminal too small ({width}x{height or '?'}; coordctl top needs "
                          f"{MIN_WIDTH}x{MIN_HEIGHT})"[:max(1, width)], no_wrap=True,
                          overflow="crop")), data
    head = summary(st, width)
    footer = None if interval is None else Text(
        f"refresh every {interval:g}s; q or Ctrl-C quits", style="dim", no_wrap=True,
        overflow="ellipsis")
    room = height + 1 if footer is None and height is not None else height  # no footer line
    waiting = st.waiting  # the oldest due ones of each priority, P0 first (coordd)
    n_head, full, (n_w, n_q, n_r, n_f) = layout(
        len(head), [len(ws.workers), len(waiting), len(running), len(failed)], room)
    head = head[:n_head - 1] + head[-1:] if n_head > 1 else head[:1]
    worker_rows = [_worker_row(w) for w in ws.workers[:n_w]]
    wait_rows = [[w.job_id, w.kind, f"P{w.priority}", render.fmt_age(w.waited_s),
                  " ".join((w.reason or "").split())] for w in waiting[:n_q]]
    run_rows = []
    for j in running[:n_r]:
        left = j.lease.expires_at - st.now if j.lease else None
        run_rows.append([j.job_id, j.kind, f"P{j.priority}", j.lease.worker_id if j.lease else "-",
                         f"{j.attempts}/{j.max_attempts}",
                         ("-" if left is None else render.fmt_age(max(0.0, left)))
                         + (", cancelling" if j.cancel_requested else "")])
    fail_rows = [[j.job_id, j.kind, render.fmt_time(j.finished_at),
                  " ".join((j.last_error or "").split())] for j in failed[:n_f]]
    titles = [_title("workers", len(ws.workers), n_w),
              _title("oldest waiting", len(waiting), n_q),
              _title("running", st.jobs.get("running", 0), n_r),
              "recent failures" if n_f == len(failed) else
              f"recent failures ({n_f} of {len(failed)} shown)"]
    tables = [(WORKER_COLUMNS, worker_rows), (WAITING_COLUMNS, wait_rows),
              (RUNNING_COLUMNS, run_rows), (FAILED_COLUMNS, fail_rows)]
    parts: list[Any] = [*head]
    for i, (title, (columns, rows)) in enumerate(zip(titles, tables)):
        if i == 0 and not ws.workers:
            parts.append(Text("no workers have sent a heartbeat", no_wrap=True,
                              overflow="ellipsis"))
        elif full[i]:
            parts.append(fitted(title, columns, rows, width))
        else:
            parts.append(Text(render.safe(title), no_wrap=True, overflow="ellipsis"))
    if footer is not None:
        parts.append(footer)
    return Group(*parts), data


def _worker_row(w: Any) -> list[str]:
    r = w.readings
    mem = r.get("memory_used_pct")
    return [w.worker_id, ",".join(w.roles), f"{render.fmt_age(w.heartbeat_age_s)} ago",
            render.liveness(w),
            f"{mem:.0f}" if isinstance(mem, (int, float)) else "-",
            f"{r['temperature_c']:.0f}°C" if isinstance(r.get("temperature_c"), (int, float))
            else "-",
            "-" if r.get("on_battery") is None else ("battery" if r["on_battery"] else "mains"),
            render.fmt_age(r["user_idle_s"]) if isinstance(r.get("user_idle_s"), (int, float))
            else "-",
            str(w.active_leases), *render.verdict_cells(w)]


def view_size(console: Console) -> tuple[int, int | None]:
    """The console's (width, height); height None when printing to a pipe (no LINES)."""
    height = console.height if console.is_terminal or "LINES" in os.environ else None
    return console.width, height


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """Yield `wait(seconds) -> str | None`: the key pressed within the wait, if any.

    On a terminal, stdin is in cbreak mode for the duration (restored on exit);
    elsewhere the wait just sleeps.
    """
    fd = sys.stdin.fileno() if sys.stdin and sys.stdin.isatty() else None
    if fd is None:
        def sleep(seconds: float) -> str | None:
            time.sleep(seconds)
            return None
        yield sleep
        return
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        def wait(seconds: float) -> str | None:
            ready, _, _ = select.select([fd], [], [], seconds)
            return os.read(fd, 1).decode(errors="replace") if ready else None
        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run(client: Any, console: Console, interval: float, once: bool) -> dict[str, Any]:
    """Show the live view until `q` or Ctrl-C (or one frame with `once`); return the last
    frame's data."""
    if once:
        view, data = frame(client, None, view_size(console))
        console.print(view)
        return data
    view, data = frame(client, interval, view_size(console))
    if not console.is_terminal:  # Live would show a pipe nothing before it stops
        return _frames(client, console, interval, view, data)
    try:
        with _keys() as wait, Live(view, console=console, auto_refresh=False,
                                   screen=console.is_terminal) as live:
            while (key := wait(interval)) not in ("q", "Q"):
                if key is None:
                    view, data = frame(client, interval, view_size(console))
                    live.update(view, refresh=True)
    except KeyboardInterrupt:
        pass
    return data


def _frames(client: Any, console: Console, interval: float, view: Group,
            data: dict[str, Any]) -> dict[str, Any]:
    """Into a pipe or a file: write `view` (whose data is `data`), then a fresh frame every
    `interval` seconds, each whole and flushed, until Ctrl-C; return the last frame's data."""
    try:
        while True:
            console.print(view)
            console.print()
            console.file.flush()
            time.sleep(interval)
            view, data = frame(client, interval, view_size(console))
    except KeyboardInterrupt:
        pass
    return data
