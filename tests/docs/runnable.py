"""The runnable command blocks of the docs, and a real coordd and coord-worker to run
them against.

A block is marked by a line `<!-- runnable -->` right before a ```bash fence, in any
docs/**/*.md or README.md. Each block runs in its own `bash` with `set -euo pipefail`, in
a scratch folder holding a link to the repository's `examples/`, with the environment a
reader has after the getting-started steps: `coordctl`, `coordd` and `coord-worker` on
PATH, and the running coordd at the per-user default socket and database (under the
scratch `XDG_RUNTIME_DIR` and `XDG_STATE_HOME`), with no `COORDD_SOCKET` / `COORDD_DB` set:
a reader who ran `coordd &` exported neither. A worker `docs-w1` runs
the kinds of examples/worker.toml for the roles in `ROLES`, with cool, idle, on-mains
readings (so gates pass). Processes a block leaves in the background are killed when it
ends.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w+)\s*$")
ROLES = "cpu,gather,narrate,build"
WORKER_ID = "docs-w1"
BLOCK_TIMEOUT_S = 60.0
START_TIMEOUT_S = 20.0
READINGS = {"memory_used_pct": 20.0, "temperature_c": 40.0, "on_battery": False,
            "battery_pct": 100.0, "user_idle_s": 3600.0}
COORDD_CONFIG = """\
# coordd for the docs' runnable blocks: the defaults, with a quick reaper
reaper_interval_s = 0.5
"""


@dataclass(frozen=True)
class Block:
    """One runnable block: where it is (file relative to the root, 1-based line of its
    fence) and its text."""

    path: str
    line: int
    code: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


class MarkerError(ValueError):
    """A runnable marker not followed by a ```bash block."""


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    files = sorted((root / "docs").rglob("*.md"))
    readme = root / "README.md"
    return ([readme] if readme.exists() else []) + files


def blocks_in(text: str, path: str) -> list[Block]:
    """The runnable blocks of one Markdown text.

    Raises:
        MarkerError: a marker whose next line is not a ```bash fence, or an unclosed block.
    """
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = FENCE.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
        if fence is None or fence.group(1) not in ("bash", "sh", "shell"):
            raise MarkerError(f"{path}:{i + 1}: {MARKER} must be right before a ```bash block")
        for j in range(i + 2, len(lines)):
            if lines[j].strip() == "```":
                out.append(Block(path, i + 2, "\n".join(lines[i + 2:j]) + "\n"))
                break
        else:
            raise MarkerError(f"{path}:{i + 2}: the runnable block is never closed")
    return out


def all_blocks(root: Path = ROOT) -> list[Block]:
    """Every runnable block of the docs, in file order."""
    return [b for f in doc_files(root)
            for b in blocks_in(f.read_text(), str(f.relative_to(root)))]


@dataclass
class Site:
    """A running coordd and worker, and the environment blocks run in."""

    tmp: Path
    env: dict[str, str]
    procs: list[subprocess.Popen]

    def logs(self) -> str:
        """The tail of coordd's and the worker's logs (for a failure message)."""
        out = []
        for name in ("coordd.log", "worker.log"):
            path = self.tmp / name
            if path.exists():
                out.append(f"--- {name} (tail) ---\n"
                           + path.read_text(errors="replace")[-2000:])
        return "\n".join(out)

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        """Run one block in bash (`set -euo pipefail`); kill what it left behind."""
        script = "set -euo pipefail\n" + block.code
        proc = subprocess.Popen(["bash", "-c", script], cwd=self.tmp / "work", env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out += f"\n(killed after {BLOCK_TIMEOUT_S:g} s)"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its background processes, if any
            except ProcessLookupError:
                pass
        return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def _wait_worker(socket: str, procs: list[subprocess.Popen], tmp: Path) -> None:
    from coordd.client import SyncClient
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[:3]} exited {p.returncode}:\n"
                                   + Site(tmp, {}, []).logs())
        try:
            with SyncClient(socket, timeout=2) as c:
                if any(w.worker_id == WORKER_ID and w.live for w in c.workers().workers):
                    return
        except Exception:  # not up yet: refused, not listening, no reply
            pass
        time.sleep(0.05)
    raise RuntimeError("coordd and the docs worker did not come up:\n"
                       + Site(tmp, {}, []).logs())


def start_site(tmp: Path) -> Iterator[Site]:
    """Start coordd and the worker in `tmp`; yield the Site; stop both (a generator for a
    fixture)."""
    bin_dir = os.path.dirname(sys.executable)
    run_dir, state_dir = tmp / "run", tmp / "state"  # XDG_RUNTIME_DIR, XDG_STATE_HOME
    (run_dir / "coordd").mkdir(parents=True)
    (state_dir / "coordd").mkdir(parents=True)
    socket = str(run_dir / "coordd" / "coordd.sock")  # the defaults `coordd &` would use
    db = str(state_dir / "coordd" / "coordd.db")
    (tmp / "work").mkdir()
    (tmp / "work" / "examples").symlink_to(ROOT / "examples")
    (tmp / "coordd.toml").write_text(COORDD_CONFIG)
    (tmp / "readings.json").write_text(json.dumps(READINGS))
    worker_toml = (f"work_dir = {json.dumps(str(tmp / 'worker-work'))}\n"
                   + (ROOT / "examples" / "worker.toml").read_text())
    (tmp / "worker.toml").write_text(worker_toml)
    env = {**{k: v for k, v in os.environ.items() if k not in ("COORDD_SOCKET", "COORDD_DB")},
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "XDG_RUNTIME_DIR": str(run_dir), "XDG_STATE_HOME": str(state_dir),
           "NO_COLOR": "1", "COLUMNS": "120"}
    procs = []
    with open(tmp / "coordd.log", "ab") as log:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "coordd", "--db", db, "--socket", socket,
             "--config", str(tmp / "coordd.toml")], stdout=log, stderr=log, env=env))
    with open(tmp / "worker.log", "ab") as log:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "worker", "--worker-id", WORKER_ID, "--roles", ROLES,
             "--socket", socket, "--config", str(tmp / "worker.toml"),
             "--readings-override", str(tmp / "readings.json")],
            stdout=log, stderr=log, env=env, cwd=tmp))
    try:
        _wait_worker(socket, procs, tmp)
        yield Site(tmp, env, procs)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
