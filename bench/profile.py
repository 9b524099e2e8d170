"""Sample the coordd process with py-spy during a drain and summarize where time goes.

`py-spy record --format raw --threads --nonblocking` writes collapsed stacks
("thread;frame;...;frame count"); idle threads (waiting in epoll or on a queue) are
not sampled. The summary gives, per thread, the top functions by self samples and by
inclusive samples (a function counted once per stack).
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

RATE_HZ = 250


class Profiler:
    """py-spy attached to one pid for the duration of a `with` block (no-op without py-spy)."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.proc: subprocess.Popen | None = None
        beside = Path(sys.executable).parent / "py-spy"
        self.exe = str(beside) if beside.exists() else shutil.which("py-spy")
        if self.exe is None:
            print("  py-spy not found (pip install py-spy): no profile")

    def __enter__(self) -> "Profiler":
        if self.exe:
            self.proc = subprocess.Popen(
                [self.exe, "record", "-p", str(self.pid), "-o", str(self.out), "-f", "raw",
                 "-r", str(RATE_HZ), "--threads", "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)  # let it attach before the load starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _short(frame: str) -> str:
    # "name (path/to/file.py:123)" -> "name (file.py:123)"
    if " (" in frame and frame.endswith(")"):
        name, loc = frame[:-1].split(" (", 1)
        return f"{name} ({loc.rsplit('/', 1)[-1]})"
    return frame


def summarize(path: Path, top: int = 15) -> dict:
    """Per thread: total samples, top self and inclusive functions with their share."""
    threads: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread, frames = frames[0], [_short(f) for f in frames[1:]]
        t = threads.setdefault(thread, {"total": 0, "self": collections.Counter(),
                                        "incl": collections.Counter()})
        t["total"] += n
        if frames:
            t["self"][frames[-1]] += n
        for f in set(frames):
            t["incl"][f] += n
    grand = sum(t["total"] for t in threads.values()) or 1
    out = {}
    for name, t in sorted(threads.items(), key=lambda kv: -kv[1]["total"]):
        tot = t["total"] or 1
        out[name] = {
            "samples": t["total"], "share_of_all": round(t["total"] / grand, 3),
            "self": [(f, round(c / tot, 3)) for f, c in t["self"].most_common(top)],
            "inclusive": [(f, round(c / tot, 3)) for f, c in t["incl"].most_common(top)],
        }
    return out


def print_summary(summary: dict, top: int = 12) -> None:
    for thread, t in summary.items():
        print(f"  {thread}: {t['samples']} samples ({100 * t['share_of_all']:.0f}% of all)")
        print("    self:      " + "; ".join(f"{f} {100 * s:.0f}%" for f, s in t["self"][:top]))
        print("    inclusive: " + "; ".join(f"{f} {100 * s:.0f}%" for f, s in t["inclusive"][:top]))
