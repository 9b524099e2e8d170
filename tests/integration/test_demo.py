"""The README's main job, scaled down: the demo runs every job once and leaves no process,
whatever happens at the keyboard meanwhile (issue 31 item 1), and Ctrl-C says what it
stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


class Typing:
    """Keystrokes into a terminal of our own all along: a pty whose slave is read every
    second, so its atime (what the idle probes read for a text session) stays fresh."""

    def __enter__(self) -> "Typing":
        self.master, self.slave = os.openpty()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._type, daemon=True)
        self.thread.start()
        return self

    def _type(self) -> None:
        while not self.stop.is_set():
            os.write(self.master, b"x\n")
            os.read(self.slave, 64)
            self.stop.wait(1.0)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        os.close(self.master)
        os.close(self.slave)


def demo(run: Path, *extra: str, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "worker.demo", "--run-dir", str(run), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, **kw)


def test_demo_batch_succeeds_while_the_terminal_is_in_use(tmp_path):
    """Issue 31 item 1: P3 `train` waited for the user to be idle 300 s, so a terminal in
    use stalled the demo until it timed out (`train waiting: None`, exit 1)."""
    run = tmp_path / "run"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with Typing():
        p = demo(run, "--requests", "12", "--train", "2", "--train-steps", "30",
                 "--timeout", "60")
        out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out[-3000:]
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 14
    assert all(r["status"] == "succeeded" and r["attempts"] == 1 for r in rows)
    kw = [r for r in rows if r["kind"] == "keywords"]
    assert all(r["result"]["top"] and r["result"]["module"] for r in kw)
    train = [r for r in rows if r["kind"] == "train"]
    assert train[0]["result"]["steps"] == 30
    assert min(r["finished_at"] for r in train) > max(r["finished_at"] for r in kw)
    flat = " ".join(out.split())
    assert "P3 idle learning may start (it waited at its gate: gate user idle 0s < 300s" \
        in flat, out  # P3 governed, the gate named, and the wait ended by itself
    assert "None" not in out
    assert "all demo processes stopped (w2, w1, coordd)" in flat
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before


def test_ctrl_c_says_what_it_stopped(tmp_path):
    run = tmp_path / "run"
    p = demo(run, "--requests", "150", "--train", "1", "--timeout", "60")
    deadline = time.monotonic() + 30
    while not (run / "w2.log").exists() or "claimed" not in (run / "w2.log").read_text():
        assert time.monotonic() < deadline and p.poll() is None, p.stdout.read()
        time.sleep(0.1)
    kids = psutil.Process(p.pid).children(recursive=True)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    flat = " ".join(out.split())
    assert p.returncode == 130, out
    assert "interrupted (Ctrl-C): stopping w2, w1, coordd" in flat, out
    assert "jobs had not finished" in flat and str(run) in flat.replace(" ", "")
    assert "all demo processes stopped (w2, w1, coordd)" in flat
    assert not [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]


def test_first_run_says_it_is_installing(tmp_path):
    """demo.sh's first run spends ~35 s in pip: it says so before, not after."""
    (tmp_path / "demo.sh").write_text((REPO / "demo.sh").read_text())
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "python3").write_text(
        "#!/bin/sh\n"  # `python3 -m venv .venv`: a venv whose pip and python only echo
        "mkdir -p .venv/bin\n"
        "printf '#!/bin/sh\\necho PIP \"$@\"\\ntouch .venv/bin/coordd; chmod +x .venv/bin/coordd\\n' > .venv/bin/pip\n"
        "printf '#!/bin/sh\\necho DEMO \"$@\"\\n' > .venv/bin/python\n"
        "chmod +x .venv/bin/pip .venv/bin/python\n")
    (stubs / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    first = subprocess.run(["bash", str(tmp_path / "demo.sh")], capture_output=True, text=True,
                           env=env, timeout=30)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    pip = next(i for i, ln in enumerate(lines) if ln.startswith("PIP"))
    assert any("installing" in ln for ln in lines[:pip]), first.stdout
    assert lines[-1] == "DEMO -m worker.demo"
    again = subprocess.run(["bash", str(tmp_path / "demo.sh")], capture_output=True, text=True,
                           env=env, timeout=30)
    assert again.stdout.splitlines() == ["DEMO -m worker.demo"]


def test_the_watch_command_names_a_coordctl_that_runs(tmp_path):
    """`./demo.sh` installs into .venv and does not put it on the PATH, so the printed
    `coordctl --socket ... top` was `command not found` in the reader's other terminal."""
    from worker.demo import coordctl_program
    beside = Path(sys.executable).parent / "coordctl"
    assert beside.exists()  # the test venv has the console scripts
    assert coordctl_program(path=str(tmp_path)) == str(beside)  # not on this PATH
    assert coordctl_program(path=str(beside.parent)) == "coordctl"


def test_the_watch_command_is_printed_as_a_shell_reads_it(tmp_path):
    """A run folder or checkout with a space or `[...]` in its path printed a command that
    did not work: unquoted, and rich took `[work]` for markup and dropped it."""
    import io
    import shlex

    from rich.console import Console

    from worker.demo import show_watch
    sock = "/tmp/my runs/[work]/coordd.sock"
    out = io.StringIO()
    show_watch(Console(file=out, width=40, color_system=None), sock, path=str(tmp_path))
    line = out.getvalue()
    assert line.startswith("watch from another terminal: ") and line.count("\n") == 1, line
    argv = shlex.split(line.removeprefix("watch from another terminal: "))
    assert argv == [str(Path(sys.executable).parent / "coordctl"), "--socket", sock, "top"]
