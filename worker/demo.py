"""The main job, end to end: `python -m worker.demo` (what `./demo.sh` runs).

Starts a private coordd and two coord-worker supervisors in a fresh run folder, enqueues
a real batch — one `keywords` request per standard-library module (P0..P2, a person
waiting) plus a few `train` jobs (P3 idle learning: a character n-gram model trained on
the standard library's docstrings, checkpointed and resumable) — shows live progress,
prints a summary (done/failed per kind, time, throughput, P0-before-P3 check) and where
the results are, then stops every process it started.

The user's idle time is simulated, so the run is the same whatever happens at this
machine's keyboard: the workers read it from a readings override (`--readings-override`)
that says "at the keyboard" while requests are being answered, so the P3 jobs wait at
their gate (the progress line says which), and "stepped away" once every request is done,
so they run. coordd's other gates (memory, heat) stay real.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from coordd.client import Client
from coordd.clock import SystemClock
from coordd.wire.protocol import TERMINAL_STATUSES

DENY = frozenset({
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "pydoc_data",
    "lib2to3", "ensurepip", "venv", "msilib", "winreg", "winsound", "nt", "msvcrt",
    "nturl2path", "ntpath", "sre_compile", "sre_constants", "sre_parse",
})
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 30.0
CLOCK = SystemClock()

AT_KEYBOARD = {"user_idle_s": 0.0, "user_idle_reason": "demo: simulated user at the keyboard"}
STEPPED_AWAY = {"user_idle_s": 3600.0, "user_idle_reason": "demo: simulated user stepped away"}
COORDD_CONFIG = """\
# demo coordd: P3 idle work keeps its default gates (a user idle for 5 minutes, memory,
# heat), except mains power, so a laptop on battery finishes the demo too. The workers'
# user idle time is simulated (readings.json, see worker/demo.py).
reaper_interval_s = 1.0
[gates.p3]
require_mains = false
"""

WORKER_CONFIG = """\
lease_s = 15
heartbeat_interval_s = 2
claim_interval_s = 0.2
work_dir = "{work}"

[kinds.keywords]
argv = ["{{python}}", "-m", "worker.models.keywords", "--payload", "{{payload}}", "--result", "{{result}}"]
timeout_s = 120
slots = 2

[kinds.train]
argv = ["{{python}}", "-m", "worker.models.train", "--payload", "{{payload}}", "--result", "{{result}}",
        "--checkpoint-dir", "{{checkpoint_dir}}", "--resume-from", "{{resume_from}}"]
timeout_s = 900
slots = 1
"""


def stdlib_modules(limit: int) -> list[str]:
    """Public, importable standard-library module names, sorted, at most `limit`."""
    mods = sorted(m for m in sys.stdlib_module_names
                  if not m.startswith("_") and m not in DENY
                  and importlib.util.find_spec(m) is not None)
    return mods[:limit]


def batch(n_requests: int, n_train: int, train_steps: int) -> list[dict[str, Any]]:
    """The demo jobs: P3 train jobs first (so they are the oldest), then keyword requests."""
    jobs = [{"kind": "train", "required_role": "idle", "priority": 3,
             "payload": {"steps": train_steps, "seed": i, "checkpoint_every": 20}}
            for i in range(n_train)]
    for i, mod in enumerate(stdlib_modules(n_requests)):
        jobs.append({"kind": "keywords", "required_role": "cpu", "priority": i % 3,
                     "payload": {"module": mod, "top": 10}})
    return jobs


def write_readings(path: Path, readings: dict[str, Any]) -> None:
    """Replace the workers' readings override at once (they read it every heartbeat)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(readings))
    os.replace(tmp, path)


class Fleet:
    """The processes the demo starts; `stop()` ends them all and reports leftovers."""

    def __init__(self, run: Path) -> None:
        self.run = run
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.run / f"{name}.log", "wb")
        self.procs.append((name, subprocess.Popen(argv, stdout=log, stderr=log,
                                                  start_new_session=True)))
        log.close()

    def running(self) -> list[str]:
        """Names of the started processes still running, workers first."""
        return [name for name, p in reversed(self.procs) if p.poll() is None]

    def stop(self) -> list[str]:
        """SIGTERM workers first, then coordd; SIGKILL what is left after the timeout."""
        for name, p in reversed(self.procs):  # workers were started last
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        left = []
        for name, p in self.procs:
            try:
                os.killpg(p.pid, 0)
                left.append(name)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left

    def check_alive(self) -> None:
        """Raise RuntimeError if any process the demo started has exited."""
        for name, p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited {p.returncode}; see {self.run}/{name}.log")


async def wait_socket(path: str, fleet: Fleet) -> None:
    deadline = CLOCK.mono() + START_TIMEOUT_S
    while CLOCK.mono() < deadline:
        fleet.check_alive()
        try:
            async with Client(path, timeout=2) as c:
                await c.status()
                return
        except Exception:
            await asyncio.sleep(0.05)
    raise RuntimeError("coordd did not come up")


class RunState:
    """What the run got to, for the summary after a timeout or Ctrl-C."""

    def __init__(self) -> None:
        self.total = 0
        self.done = 0
        self.p3_gate: str | None = None  # the reason a P3 job waited, seen while at the keyboard


def short(reason: str | None) -> str:
    """A waiting reason cut to its first worker's verdict, without its timestamp."""
    return (reason or "not claimed yet").split(";")[0].split(" (checked")[0]


async def p3_line(c: Client, ids: list[str], state: RunState,
                  away: bool) -> tuple[dict[str, int], str]:
    """(P3 jobs per status, the P3 progress line: running, or waiting with its gate's
    reason)."""
    views = await asyncio.gather(*(c.get_job(i) for i in ids))
    counts = {s: sum(v.status == s for v in views) for s in ("waiting", "running")}
    counts["ended"] = sum(v.status in TERMINAL_STATUSES for v in views)
    waiting = [v for v in views if v.status == "waiting"]
    if waiting:
        reason = short(waiting[0].waiting_reason)
        if not away and reason.startswith("gate"):
            state.p3_gate = reason
        return counts, f"P3: {len(waiting)} waiting, {reason}"
    return counts, (f"P3: running {counts['running']}" if counts["ended"] < len(ids)
                    else "P3: done")


def coordctl_program(path: str | None = None) -> str:
    """How to call coordctl from another terminal: `coordctl` where the PATH (`path`,
    default $PATH) finds the one beside this interpreter, else that one's full path
    (`./demo.sh` installs into .venv without putting it on the PATH)."""
    mine = Path(sys.executable).parent / "coordctl"
    if not mine.exists():
        return "coordctl"
    found = shutil.which("coordctl", path=path)  # None: $PATH
    return "coordctl" if found and Path(found) == mine else str(mine)


def show_watch(console: Console, sock: str, path: str | None = None) -> None:
    """Print the command that watches this run from another terminal: on one line,
    quoted for a shell, as it is (no rich markup), so it can be copied whole."""
    cmd = shlex.join([coordctl_program(path), "--socket", sock, "top"])
    console.print(f"watch from another terminal: {cmd}", soft_wrap=True, markup=False,
                  highlight=False)


async def drive(args: argparse.Namespace, run: Path, fleet: Fleet, console: Console,
                state: RunState) -> int:
    sock = str(run / "coordd.sock")
    py = sys.executable
    readings = run / "readings.json"
    (run / "coordd.toml").write_text(COORDD_CONFIG)
    (run / "worker.toml").write_text(WORKER_CONFIG.format(work=run / "work"))
    write_readings(readings, AT_KEYBOARD)
    fleet.spawn("coordd", [py, "-m", "coordd", "--db", str(run / "coordd.db"), "--socket", sock,
                           "--config", str(run / "coordd.toml")])
    await wait_socket(sock, fleet)
    for w in ("w1", "w2"):
        fleet.spawn(w, [py, "-m", "worker", "--worker-id", w, "--roles", "cpu,idle",
                        "--socket", sock, "--config", str(run / "worker.toml"),
                        "--readings-override", str(readings)])
    jobs = batch(args.requests, args.train, args.train_steps)
    t0 = CLOCK.mono()
    away = False
    async with Client(sock, timeout=30) as c:
        ids = [r.job_id for r in (await c.enqueue_batch(jobs)).jobs]
        kind_of = dict(zip(ids, (j["kind"] for j in jobs)))
        p3 = [i for i, j in zip(ids, jobs) if j["priority"] == 3]
        state.total = len(ids)
        console.print(f"{len(ids) - len(p3)} requests (P0..P2) and {len(p3)} P3 idle-learning "
                      "jobs; the simulated user is at the keyboard until the requests are done")
        show_watch(console, sock)
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
            requests = bar.add_task("requests", total=len(ids) - len(p3))
            learning = bar.add_task("P3 idle learning", total=len(p3))
            while True:
                st = await c.status()
                state.done = done = sum(st.jobs[s] for s in TERMINAL_STATUSES)
                if not away and done >= len(ids) - len(p3) and await requests_done(c, ids, p3):
                    away = True
                    write_readings(readings, STEPPED_AWAY)
                    bar.console.print("requests done: the simulated user steps away, so P3 "
                                      "idle learning may start (it waited at its gate: "
                                      f"{state.p3_gate or 'no wait seen'})")
                p3_n, line = await p3_line(c, p3, state, away)
                bar.update(requests, completed=done - p3_n["ended"], description=(
                    f"requests: running {st.jobs['running'] - p3_n['running']}, "
                    f"waiting {st.jobs['waiting'] - p3_n['waiting']}"))
                bar.update(learning, completed=p3_n["ended"], description=line)
                if done >= len(ids):
                    break
                if CLOCK.mono() - t0 > args.timeout:
                    console.print(f"[red]timed out after {args.timeout:g}s")
                    break
                fleet.check_alive()
                await asyncio.sleep(0.5)
        elapsed = CLOCK.mono() - t0
        views = await asyncio.gather(*(c.get_job(i) for i in ids))
    return report(views, kind_of, elapsed, run, console)


async def requests_done(c: Client, ids: list[str], p3: list[str]) -> bool:
    """Whether every job but the P3 ones has ended."""
    wanted = set(p3)
    views = await asyncio.gather(*(c.get_job(i) for i in ids if i not in wanted))
    return all(v.status in TERMINAL_STATUSES for v in views)


def report(views: list[Any], kind_of: dict[str, str], elapsed: float, run: Path,
           console: Console) -> int:
    """Print the summary table and write results.jsonl; return the exit code."""
    table = Table(title=f"coordd demo: {len(views)} jobs in {elapsed:.1f}s "
                        f"({len(views) / elapsed:.1f} jobs/s)")
    for col in ("kind", "jobs", "succeeded", "failed", "attempts>1"):
        table.add_column(col, justify="right" if col != "kind" else "left")
    for kind in sorted(set(kind_of.values())):
        vs = [v for v in views if v.kind == kind]
        table.add_row(kind, str(len(vs)), str(sum(v.status == "succeeded" for v in vs)),
                      str(sum(v.status == "failed" for v in vs)),
                      str(sum(v.attempts > 1 for v in vs)))
    console.print(table)
    with open(run / "results.jsonl", "w") as f:
        for v in views:
            f.write(json.dumps({"job_id": v.job_id, "kind": v.kind, "priority": v.priority,
                                "status": v.status, "attempts": v.attempts,
                                "finished_at": v.finished_at, "result": v.result,
                                "error": v.last_error}) + "\n")
    p0 = [v.finished_at for v in views if v.priority == 0 and v.finished_at]
    p3 = [v.finished_at for v in views if v.priority == 3 and v.finished_at]
    if p0 and p3:
        gap = max(p3) - max(p0)
        console.print(f"last P0 request finished {abs(gap):.1f}s "
                      f"{'before' if gap >= 0 else 'after'} the last P3 idle-learning job")
    for v in views:
        if v.kind == "train" and v.result:
            console.print(f"train {v.job_id}: {v.result.get('steps')} steps, perplexity "
                          f"{v.result.get('perplexity'):.2f}, sample {v.result.get('sample')!r}")
            break
    console.print(f"results: {run / 'results.jsonl'}  (database {run / 'coordd.db'})")
    failed = [v for v in views if v.status != "succeeded"]
    for v in failed[:5]:
        console.print(f"[red]{v.job_id} {v.kind} P{v.priority} {v.status}: {why(v)}")
    return 0 if not failed else 1


def why(v: Any) -> str:
    """Why job view `v` is where it is, never None: its error, its waiting reason, or its
    lease holder."""
    if v.status == "waiting":
        return v.waiting_reason or "waiting, no reason recorded"
    if v.status == "running" and v.lease is not None:
        return f"running on {v.lease.worker_id}"
    return v.last_error or "no error recorded"


def main(argv: list[str] | None = None) -> int:
    """Run the demo; exit 0 when every job succeeded and no process was left behind."""
    p = argparse.ArgumentParser(prog="python -m worker.demo", description=__doc__)
    p.add_argument("--requests", type=int, default=197,
                   help="keyword requests (one per stdlib module, at most ~197)")
    p.add_argument("--train", type=int, default=4, help="P3 train jobs")
    p.add_argument("--train-steps", type=int, default=200, help="steps per train job")
    p.add_argument("--run-dir", help="folder for the run (default: a new one under ./demo-runs)")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    args = p.parse_args(argv)
    if args.run_dir:
        run = Path(args.run_dir)
        run.mkdir(parents=True, exist_ok=True)
    else:
        Path("demo-runs").mkdir(exist_ok=True)
        run = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir="demo-runs"))
    run = run.resolve()
    console = Console()
    fleet = Fleet(run)
    state = RunState()
    code = 1
    try:
        code = asyncio.run(drive(args, run, fleet, console, state))
    except RuntimeError as exc:
        console.print(f"[red]demo failed: {exc}")
    except KeyboardInterrupt:
        code = 130
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the stop below must not be cut short
        running = fleet.running()
        console.print(f"[yellow]interrupted (Ctrl-C): stopping {', '.join(running) or 'nothing'}"
                      f"{f' (up to {STOP_TIMEOUT_S:g}s)' if running else ''}; "
                      f"{state.total - state.done} of {state.total} jobs had not finished; "
                      f"the run so far is in {run}")
    finally:
        left = fleet.stop()
        if left:
            console.print(f"[red]processes left behind and killed: {left}")
            code = code if code == 130 else 1
        else:
            console.print("all demo processes stopped" + (
                f" ({', '.join(n for n, _ in reversed(fleet.procs))})" if fleet.procs else ""))
    return code


if __name__ == "__main__":
    sys.exit(main())
