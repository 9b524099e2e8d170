"""`coordctl top`: a live view of coordd — queues, workers with readings and gate verdicts,
running jobs with the lease time left, recent failures. Refreshes in place; `q` (on a
terminal) or Ctrl-C quits. `--once` prints one frame and exits (for scripts and tests).
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import tty
from collections.abc import Iterator
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from coordctl import render

RUNNING_SHOWN = 15
FAILED_SHOWN = 5


def frame(client: Any, interval: float) -> tuple[Group, dict[str, Any]]:
    """Fetch one view (four RPCs) and return it as a renderable and as plain data."""
    st = client.status()
    ws = client.workers()
    running = client.list_jobs(status="running", limit=RUNNING_SHOWN).jobs
    failed = client.list_jobs(status="failed", limit=FAILED_SHOWN, newest_first=True).jobs
    run_t = render.SafeTable(title=f"running ({st.jobs.get('running', 0)})", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("id", "kind", "prio", "worker", "attempt", "lease left", "cancel"):
        run_t.add_column(col)
    for j in running:
        left = j.lease.expires_at - st.now if j.lease else None
        run_t.add_row(j.job_id, j.kind, f"P{j.priority}", j.lease.worker_id if j.lease else "-",
                      f"{j.attempts}/{j.max_attempts}",
                      "-" if left is None else render.fmt_age(max(0.0, left)),
                      "requested" if j.cancel_requested else "")
    fail_t = render.SafeTable(title="recent failures", title_justify="left", box=box.SIMPLE_HEAD,
                   show_edge=False)
    for col in ("id", "kind", "finished", "last error"):
        fail_t.add_column(col, overflow="fold")
    for j in failed:
        fail_t.add_row(j.job_id, j.kind, render.fmt_time(j.finished_at), j.last_error or "")
    parts: list[Any] = [render.status_table(st, list(st.warnings)),
                        render.workers_table(ws) if ws.workers
                        else Text("no workers have sent a heartbeat"),
                        run_t, fail_t,
                        Text(f"refresh every {interval:g}s; q or Ctrl-C quits", style="dim")]
    data = {"status": st, "workers": ws.workers, "running": running, "failed": failed}
    return Group(*parts), data


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """Yield `wait(seconds) -> str | None`: the key pressed within the wait, if any.

    On a terminal, stdin is in cbreak mode for the duration (restored on exit);
    elsewhere the wait just sleeps.
    """
    fd = sys.stdin.fileno() if sys.stdin and sys.stdin.isatty() else None
    if fd is None:
        import time

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
    view, data = frame(client, interval)
    if once:
        console.print(view)
        return data
    try:
        with _keys() as wait, Live(view, console=console, auto_refresh=False,
                                   screen=console.is_terminal) as live:
            while (key := wait(interval)) not in ("q", "Q"):
                if key is None:
                    view, data = frame(client, interval)
                    live.update(view, refresh=True)
    except KeyboardInterrupt:
        pass
    return data
