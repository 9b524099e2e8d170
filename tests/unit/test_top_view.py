"""`coordctl top` fits its terminal: at 80x24 no line is wider than 80 cells and the frame
is no taller than 24 lines, whatever the names, errors and counts; columns are dropped by
rank (never wrapped), rows left out with the title saying so."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from coordctl import top
from coordd.wire.protocol import (
    JobList, JobView, LeaseView, StatusReply, WaitingJob, WorkersResult, WorkerView,
)

NOW = 1_800_000_000.0


def _job(i: int, status: str, **kw) -> JobView:
    return JobView(job_id=f"{i:016x}", kind=f"kind-with-a-long-name-{i}", required_role="gpu",
                   priority=i % 4, effective_priority=i % 4, status=status, attempts=1,
                   max_attempts=3, run_at=NOW, created_at=NOW - 60, updated_at=NOW, age_s=60,
                   **kw)


class FakeClient:
    """The four reads `top` makes, answered from fixed data."""

    def __init__(self, n_workers: int, n_running: int, n_failed: int,
                 waiting: list[WaitingJob] | None = None, warnings: list[str] | None = None
                 ) -> None:
        self.waiting, self.warnings = waiting or [], warnings
        self.workers_ = [WorkerView(
            worker_id=f"gpu-box-{i}.lab.example.org", roles=["cpu", "gpu", "train", "embed"],
            readings={"memory_used_pct": 91.5, "temperature_c": 88.0, "on_battery": True,
                      "user_idle_s": 12.0},
            heartbeat_at=NOW - 2, heartbeat_age_s=2.0, live=True, active_leases=2,
            verdicts={"p0": ["memory_high", "too_hot"], "p1": ["memory_high"],
                      "p2": ["memory_high"], "p3": ["on_battery", "user_active", "too_hot"]})
            for i in range(n_workers)]
        lease = LeaseView(worker_id="gpu-box-0.lab.example.org", token=7, granted_at=NOW,
                          expires_at=NOW + 25, lease_s=30)
        self.running = [_job(i, "running", lease=lease, cancel_requested=i == 0)
                        for i in range(n_running)]
        self.failed = [_job(100 + i, "failed", finished_at=NOW,
                            last_error="exit 1: Traceback (most recent call last):\n  File "
                                       "\"model.py\", line 3, in <module>\n" + "x" * 300)
                       for i in range(n_failed)]
        self.n_running = n_running

    def status(self) -> StatusReply:
        jobs = {"waiting": 123456, "running": self.n_running, "succeeded": 9876543,
                "failed": 4321, "cancelled": 12, "blocked": 3, "skipped": 1}
        return StatusReply(workers=len(self.workers_), workers_live=len(self.workers_),
                           active_leases=self.n_running, jobs=jobs,
                           waiting_by_priority={"p0": 1, "p1": 22, "p2": 333, "p3": 123100},
                           db_bytes=3 << 30, wal_bytes=200 << 20, oldest_waiting_age_s=90_000,
                           warnings=self.warnings if self.warnings is not None else [
                               "database is 3.0 GiB (warn_db_bytes 2.0 GiB)",
                               "WAL is 200.0 MiB"], now=NOW, waiting=self.waiting)

    def workers(self) -> WorkersResult:
        return WorkersResult(workers=self.workers_)

    def list_jobs(self, status: str, limit: int, newest_first: bool = False) -> JobList:
        jobs = self.running if status == "running" else self.failed
        return JobList(jobs=jobs[:limit])


def render_lines(client: FakeClient, width: int, height: int | None) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, height=height or 25, color_system=None,
                      legacy_windows=False)
    view, _ = top.frame(client, 1.0, (width, height))
    console.print(view)
    return out.getvalue().rstrip("\n").split("\n")


@pytest.mark.parametrize("shape", [(3, 15, 5), (1, 0, 0), (12, 15, 5), (0, 2, 1)])
def test_frame_at_80x24_never_wraps_or_overflows(shape):
    lines = render_lines(FakeClient(*shape), 80, 24)
    too_wide = [line for line in lines if cell_len(line) > 80]
    assert not too_wide, "\n".join(too_wide)
    assert len(lines) <= 24, "\n".join(lines)
    text = "\n".join(lines)
    n_workers, n_running, n_failed = shape
    if n_workers:
        assert "gpu-box-0.lab.example.org" in text  # the worker id is never dropped
        assert "memory_high,too_hot" in text  # nor its P0 verdict
    if n_running:
        assert f"{0:016x}" in text and "lease left" in text and "25s, cancelling" in text
    if n_failed:
        assert "exit 1: Traceback" in text  # the error is cut, on one line
    assert "q or Ctrl-C quits" in lines[-1]


def test_rows_left_out_are_counted_in_the_title():
    text = "\n".join(render_lines(FakeClient(3, 15, 5), 80, 24))
    assert "running (15, " in text and " shown)" in text


def test_wide_terminal_keeps_every_column_and_row():
    lines = render_lines(FakeClient(3, 15, 5), 250, None)
    text = "\n".join(lines)
    for col in ("roles", "heartbeat", "mem %", "temp", "power", "user idle", "p1", "p2",
                "attempt", "finished"):
        assert col in text, col
    assert "running (15)" in text and text.count("kind-with-a-long-name") == 20
    assert all(cell_len(line) <= 250 for line in lines)


SIZES = [(80, 12), (80, 16), (40, 10), (40, 8), (60, 9), (45, 20), (120, 13), (200, 50)]


@pytest.mark.parametrize("shape", [(3, 15, 5), (1, 0, 0), (12, 15, 5), (0, 2, 1), (0, 0, 0)])
@pytest.mark.parametrize("width, height", SIZES)
def test_frame_fits_any_terminal_down_to_40x8(shape, width, height):
    lines = render_lines(FakeClient(*shape), width, height)
    text = "\n".join(lines)
    assert len(lines) <= height, text
    assert all(cell_len(line) <= width for line in lines), text
    assert "q or Ctrl-C quits" in lines[-1] and lines[0].startswith("coordd status")
    n_workers, n_running, n_failed = shape
    assert ("workers (" in text) if n_workers else ("no workers" in text)
    assert "running (" in text and "recent failures" in text  # every section says its count
    if n_running and "id" in text.split("running (", 1)[1]:
        assert f"{0:016x}" in text  # a running table shows at least one job


@pytest.mark.parametrize("width, height", [(80, 12), (80, 16), (40, 10)])
def test_short_terminal_counts_the_rows_it_leaves_out(width, height):
    text = "\n".join(render_lines(FakeClient(3, 15, 5), width, height))
    assert "running (15, " in text and " shown)" in text


@pytest.mark.parametrize("width, height", [(39, 24), (80, 7), (20, 5)])
def test_below_40x8_is_one_line_saying_so(width, height):
    lines = render_lines(FakeClient(3, 15, 5), width, height)
    assert len(lines) == 1 and lines[0].startswith("terminal too small")
    assert cell_len(lines[0]) <= width


def test_the_oldest_waiting_jobs_show_with_their_reasons_and_a_late_p0_warns():
    """Issue 31 item 8: `top` showed counts only; it names the oldest waiting jobs (as
    `status` sends them, P0 first) with why each waits, and the late-P0 warning."""
    waiting = [WaitingJob(job_id="0000a1", kind="train", required_role="cpu", priority=0,
                          waited_s=1201.0, reason="no live worker runs kind train"),
               WaitingJob(job_id="0000a2", kind="embed", required_role="gpu", priority=0,
                          waited_s=1200.0, reason="no live worker with role gpu"),
               WaitingJob(job_id="0000b1", kind="idle", required_role="cpu", priority=3,
                          waited_s=90_000.0, reason="gate user idle 12s < 300s on w1")]
    late = ("2 P0 job(s) waiting longer than warn_p0_wait_s (300s): 0000a1 (train) 1201s: "
            "no live worker runs kind train; 0000a2 (embed) 1200s: no live worker with role gpu")
    client = FakeClient(3, 2, 1, waiting=waiting, warnings=[late])
    lines = render_lines(client, 120, 30)
    text = "\n".join(lines)
    assert "oldest waiting (3)" in text
    rows = [line.split() for line in lines if line.startswith("0000") and len(line.split()[0]) == 6]
    assert [r[:4] for r in rows] == [["0000a1", "train", "P0", "20m01s"],
                                     ["0000a2", "embed", "P0", "20m00s"],
                                     ["0000b1", "idle", "P3", "1d01h"]]
    assert "no live worker runs kind train" in text and "no live worker with role gpu" in text
    assert "warnings: 2 P0 job(s) waiting longer than warn_p0_wait_s (300s)" in text
    small = "\n".join(render_lines(client, 80, 14))
    assert "oldest waiting (3, " in small and "0000a1" in small  # before running, failures


def test_layout_keeps_titles_first_then_tables_then_rows():
    assert top.layout(4, [3, 15, 5], 8) == (4, [False, False, False], [0, 0, 0])
    assert top.layout(4, [3, 15, 5], 9) == (2, [True, False, False], [1, 0, 0])
    assert top.layout(4, [3, 15, 5], 12) == (2, [True, True, False], [1, 1, 0])
    assert top.layout(4, [3, 15, 5], None) == (4, [True, True, True], [3, 15, 5])
    head, full, rows = top.layout(4, [3, 15, 5], 24)
    assert head == 4 and full == [True, True, True] and sum(rows) == 24 - 2 - 3 - 4 * 2 - 1


@pytest.mark.parametrize("height", [None, 24, 12])
def test_once_prints_one_frame_without_the_refresh_footer(height):
    """`top --once` is a one-shot: no "refresh every 1s; q or Ctrl-C quits" line, and
    the line that footer would take holds the view instead."""
    out = io.StringIO()
    console = Console(file=out, width=80, height=height or 25, color_system=None,
                      legacy_windows=False)
    if height is None:
        top.run(FakeClient(3, 15, 5), console, 1.0, once=True)
    else:
        view, _ = top.frame(FakeClient(3, 15, 5), None, (80, height))
        console.print(view)
    lines = out.getvalue().rstrip("\n").split("\n")
    text = "\n".join(lines)
    assert "refresh every" not in text and "quits" not in text, text
    assert lines[0].startswith("coordd status") and "recent failures" in text
    if height is not None:
        assert len(lines) <= height, text
        live = render_lines(FakeClient(3, 15, 5), 80, height)
        assert len(lines) == len(live) and lines[:-1] != live[:-1]  # the footer's line used


def test_a_worker_that_said_goodbye_is_offline_as_in_coordctl_workers():
    """`coordctl workers` said offline, `top` said NO for the same stopped worker."""
    client = FakeClient(3, 0, 0)
    client.workers_[1].live = False
    client.workers_[1].offline_at = NOW - 5  # stopped: it said goodbye
    client.workers_[2].live = False  # silent: no goodbye, heartbeats stale
    text = "\n".join(render_lines(client, 200, None))
    row = {line.split()[0]: line.split() for line in text.split("\n")
           if line.strip().startswith("gpu-box-")}
    assert "offline" in row["gpu-box-1.lab.example.org"], text
    assert "NO" in row["gpu-box-2.lab.example.org"], text
    assert "yes" in row["gpu-box-0.lab.example.org"], text


def test_a_worker_that_is_not_live_shows_no_gate_verdicts_only_its_liveness():
    """A stale or offline worker's verdicts (heartbeat_stale at every priority) said only
    what its `live` column says, four times over: `workers` and `top` show `-` there."""
    from types import SimpleNamespace
    from coordctl import render
    stale = {p: ["heartbeat_stale"] for p in render.PRIORITIES_SHOWN}
    gone = SimpleNamespace(live=False, offline_at=None, verdicts=stale)
    assert render.verdict_cells(gone) == ["-"] * len(render.PRIORITIES_SHOWN)
    assert render.liveness(gone) == "NO"
    held = dict(stale, **{render.PRIORITIES_SHOWN[-1]: ["user_active"]})
    held[render.PRIORITIES_SHOWN[0]] = []
    up = SimpleNamespace(live=True, offline_at=None, verdicts=held)
    cells = render.verdict_cells(up)
    assert cells[0] == "ok" and cells[-1] == "user_active"
