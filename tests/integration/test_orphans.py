"""worker.orphans with real process groups: a dead worker's recorded groups are killed,
and a group that is not ours (a reused pgid, another boot) is left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from worker import orphans

HELPER = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \
         "'import time; time.sleep(60)']); time.sleep(60)"


def spawn_group() -> tuple[subprocess.Popen, int]:
    """A leader in its own session with one child; returns (leader, child pid)."""
    leader = subprocess.Popen([sys.executable, "-c", HELPER], start_new_session=True)
    deadline = time.monotonic() + 10
    while not psutil.Process(leader.pid).children():
        assert time.monotonic() < deadline, "helper child did not start"
        time.sleep(0.02)
    return leader, psutil.Process(leader.pid).children()[0].pid


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def group():
    leader, child = spawn_group()
    yield leader, child
    for pid in (leader.pid, child):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    leader.wait(5)


def test_recorded_group_of_a_dead_leader_is_killed(group, tmp_path):
    leader, child = group
    folder = str(tmp_path / "w1")
    path = orphans.record(folder, leader.pid, "job1")
    leader.kill()  # the parent-death signal's work: the leader goes, the child stays
    leader.wait(5)
    assert not gone(child)
    killed = orphans.kill_recorded(folder)
    assert [e["job_id"] for e in killed] == ["job1"] and gone(child)
    assert not os.path.exists(path)


@pytest.mark.parametrize("field, shift", [("start_time", 5.0), ("boot_time", 3600.0)])
def test_a_group_that_is_not_ours_is_left_alone(group, tmp_path, field, shift):
    leader, child = group
    folder = str(tmp_path / "w1")
    path = orphans.record(folder, leader.pid, "job1")
    with open(path) as fh:
        entry = json.load(fh)
    entry[field] += shift  # the pid was reused by a later process / a record from another boot
    with open(path, "w") as fh:
        json.dump(entry, fh)
    assert orphans.kill_recorded(folder) == []
    assert not gone(leader.pid) and not gone(child)
    assert not os.path.exists(path)  # a stale record is dropped


def test_lock_refuses_a_second_holder(tmp_path):
    folder = str(tmp_path / "w1")
    fd = orphans.lock(folder)
    with pytest.raises(orphans.WorkerRunning):
        orphans.lock(folder)
    orphans.unlock(fd)
    orphans.unlock(orphans.lock(folder))


def test_a_second_worker_with_a_live_id_refuses_before_saying_started(tmp_path):
    """The id's lock comes first: a refused second start never logs "started"."""
    work = tmp_path / "work"
    cfg = tmp_path / "worker.toml"
    cfg.write_text(f'work_dir = "{work}"\n')
    held = orphans.lock(orphans.records_dir(str(work), "w1"))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "worker", "--worker-id", "w1", "--roles", "cpu",
             "--config", str(cfg), "--socket", str(tmp_path / "none.sock")],
            capture_output=True, text=True, timeout=30)
    finally:
        orphans.unlock(held)
    assert proc.returncode == 2
    assert "another process runs this worker id" in proc.stderr
    assert "started" not in proc.stderr + proc.stdout


def test_a_work_dir_it_cannot_write_in_is_refused_in_one_line(tmp_path):
    """A work_dir that exists but whose records folder cannot be made (left by another
    user, read-only; here a file in its place) ended in a PermissionError/NotADirectory
    traceback and status 1 from the supervisor's lock; now the start refuses it (2)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / orphans.RECORDS_DIR).write_text("")
    cfg = tmp_path / "worker.toml"
    cfg.write_text(f'work_dir = "{work}"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "--worker-id", "w1", "--roles", "cpu",
         "--config", str(cfg), "--socket", str(tmp_path / "none.sock")],
        capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot create work_dir {work}" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
