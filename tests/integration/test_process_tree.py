"""Real process trees: spawn, cancel, reap (CASES B26)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import uvloop

from worker.process import EXIT_RETRYABLE, ModelProcess, classify_exit

GRACE_S = 0.5
READY_TIMEOUT_S = 10.0

# worker.py: two helpers, both ignore SIGTERM; the second leaves the group with setsid().
WORKER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    HELPER = (
        "import os, signal, sys, time\\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "if sys.argv[1] == 'setsid':\\n"
        "    os.setsid()\\n"
        "open(f'helper-{sys.argv[1]}.pid', 'w').write(str(os.getpid()))\\n"
        "time.sleep(60)\\n"
    )
    helpers = [subprocess.Popen([sys.executable, "-c", HELPER, kind]) for kind in ("plain", "setsid")]
    print("worker running", flush=True)
    time.sleep(60)
    """
)


async def wait_for(predicate: Callable[[], bool], timeout_s: float = READY_TIMEOUT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def zombies() -> list[psutil.Process]:
    return [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]


async def start(tmp_path: Path, argv: list[str]) -> ModelProcess:
    return await ModelProcess.start(
        argv,
        env=dict(os.environ),
        cwd=str(tmp_path),
        stdout_path=str(tmp_path / "stdout.log"),
        stderr_path=str(tmp_path / "stderr.log"),
    )


async def b26_scenario(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    model = await start(tmp_path, ["sh", "-c", f"{sys.executable} worker.py | tee run.log"])
    pid_files = [tmp_path / "helper-plain.pid", tmp_path / "helper-setsid.pid"]
    await wait_for(lambda: all(p.exists() and p.read_text() for p in pid_files))
    helper_pids = [int(p.read_text()) for p in pid_files]

    leader = psutil.Process(model.pid)
    assert os.getpgid(model.pid) == model.pid and os.getsid(model.pid) == model.pid
    tree = {p.pid: p for p in leader.children(recursive=True)}
    escaped = psutil.Process(helper_pids[1])
    tree[escaped.pid] = escaped
    assert set(helper_pids) <= set(tree)
    assert os.getsid(helper_pids[1]) == helper_pids[1] != model.pid  # really left the session
    assert len(tree) >= 4  # python worker.py, tee, two helpers

    await model.terminate_tree(GRACE_S)

    assert model.returncode is not None and model.killed_by_us
    assert classify_exit(model.returncode, model.killed_by_us) == "killed"
    survivors = [pid for pid, proc in tree.items() if alive(proc)]
    assert survivors == []
    assert not psutil.pid_exists(model.pid)  # the leader, our child, is reaped
    # Orphans belong to PID 1 (or a subreaper), which reaps them; nothing is left as our zombie.
    assert [z for z in zombies() if z.pid in tree or z.pid == model.pid] == []
    assert [c for c in psutil.Process().children() if c.pid == model.pid or c.pid in tree] == []
    await model.terminate_tree(GRACE_S)  # idempotent


async def test_b26_cancel_kills_setsid_grandchildren(tmp_path: Path) -> None:
    await b26_scenario(tmp_path)


def test_b26_cancel_kills_setsid_grandchildren_under_uvloop(tmp_path: Path) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(b26_scenario(tmp_path))


async def test_sigterm_trapping_leader_gets_sigkill_after_grace(tmp_path: Path) -> None:
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
    script += "time.sleep(60)"
    model = await start(tmp_path, [sys.executable, "-c", script])
    await wait_for(lambda: (tmp_path / "stdout.log").read_text() == "ready\n")
    loop = asyncio.get_running_loop()
    began = loop.time()
    await model.terminate_tree(GRACE_S)
    assert loop.time() - began >= GRACE_S
    assert model.returncode == -9
    assert classify_exit(model.returncode, model.killed_by_us) == "killed"
    assert not psutil.pid_exists(model.pid)  # reaped, not a zombie


async def test_cancelled_terminate_still_kills_the_tree(tmp_path: Path) -> None:
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
    script += "time.sleep(60)"
    model = await start(tmp_path, [sys.executable, "-c", script])
    await wait_for(lambda: (tmp_path / "stdout.log").read_text() == "ready\n")
    task = asyncio.create_task(model.terminate_tree(30.0))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await model.wait(5.0) == -9
    await model.terminate_tree(GRACE_S)  # a later call finishes the job


async def test_cooperative_leader_exits_within_grace(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="worker.process")
    script = "import sys, time\nprint('ready', flush=True)\ntime.sleep(60)"
    model = await start(tmp_path, [sys.executable, "-c", script])
    await wait_for(lambda: (tmp_path / "stdout.log").read_text() == "ready\n")
    loop = asyncio.get_running_loop()
    began = loop.time()
    await model.terminate_tree(5.0)
    assert loop.time() - began < 4.0  # SIGTERM was enough: no waiting out the grace
    assert model.returncode == -15 and model.killed_by_us
    assert "terminating model tree" in caplog.text


async def test_terminate_after_natural_exit_is_safe(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="worker.process")
    script = "import sys; sys.stderr.write('x' * 5000 + 'END'); sys.exit(3)"
    model = await start(tmp_path, [sys.executable, "-c", script])
    assert await model.wait(10.0) == 3
    await model.terminate_tree(GRACE_S)
    # the sweep after a model's own exit is no "terminating" at INFO (it read as a kill)
    assert not [r for r in caplog.records if "terminat" in r.getMessage()], caplog.text
    await model.terminate_tree(GRACE_S)
    assert model.killed_by_us is False
    assert classify_exit(model.returncode, model.killed_by_us) == "permanent"
    tail = model.stderr_tail(100)
    assert len(tail) == 100 and tail.endswith("END")


async def test_wait_timeout_returns_none_while_running(tmp_path: Path) -> None:
    model = await start(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert await model.wait(0.05) is None
        assert model.returncode is None
    finally:
        await model.terminate_tree(GRACE_S)
    assert model.returncode == -15


async def test_start_rejects_missing_program(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await start(tmp_path, [str(tmp_path / "no-such-program")])
    with pytest.raises(ValueError):
        await start(tmp_path, [])


@pytest.mark.parametrize(
    ("returncode", "killed_by_us", "expected"),
    [
        (0, False, "success"),
        (0, True, "success"),
        (EXIT_RETRYABLE, False, "retryable"),
        (-9, False, "retryable"),  # OOM killer or an operator, not us
        (-15, True, "killed"),
        (-9, True, "killed"),
        (143, True, "killed"),  # a shell reporting 128+SIGTERM after our signal
        (1, False, "permanent"),
        (2, True, "permanent"),
        (143, False, "permanent"),
    ],
)
def test_classify_exit(returncode: int, killed_by_us: bool, expected: str) -> None:
    assert classify_exit(returncode, killed_by_us) == expected
