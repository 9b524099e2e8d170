"""File descriptors under pressure (issue 21, finding 1): a coordd started under a low
RLIMIT_NOFILE, and idle clients holding every descriptor it has."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time

import pytest

from coordd import errors
from coordd.client import SyncClient
from tests import ctlfork

LOW = 64  # coordd itself uses ~25 descriptors idle


def _limits(pid: int) -> tuple[int, int]:
    import resource
    return resource.prlimit(pid, resource.RLIMIT_NOFILE)


def _coordctl(sock: str, *argv: str) -> subprocess.CompletedProcess:
    return ctlfork.run(["--socket", sock, *argv], timeout=30)  # python -m coordctl


def test_soft_fd_limit_raised_to_hard_at_start(daemon_factory):
    d = daemon_factory()
    d.nofile = (LOW, 4096)
    d.start()
    assert _limits(d.proc.pid) == (4096, 4096)
    assert "file descriptor limit 4096)" in d.log()


def test_out_of_fds_coordd_stays_up_refuses_explicitly_and_recovers(daemon_factory):
    d = daemon_factory("reaper_interval_s = 0.2\nprune_interval_s = 0.2\n")
    d.nofile = (LOW, LOW)
    d.start()
    idle: list[socket.socket] = []
    refused = 0
    try:
        for _ in range(LOW):  # more clients than coordd has descriptors left
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.socket)
            idle.append(s)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not refused:
            time.sleep(0.05)
            for s in idle:
                s.setblocking(False)
                try:
                    if s.recv(4096):  # the refusal frame
                        refused += 1
                except BlockingIOError:
                    pass
        assert refused, f"no client was refused with an error frame:\n{d.log()}"
        res = _coordctl(d.socket, "status")
        assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
        assert "refused: coordd is out of file descriptors" in res.stderr, res.stderr
        assert "not running" not in res.stderr, res.stderr
        time.sleep(0.7)  # reaper rounds, each prune's sweep without a descriptor
        assert d.proc.poll() is None, f"coordd exited {d.proc.returncode}:\n{d.log()}"
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while True:  # the refused clients' closes and the idle ones free descriptors
        try:
            with SyncClient(d.socket, timeout=5) as c:
                c.status()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    log = d.log()
    # Logged once per episode, not once per failed accept. On a loaded machine a descriptor
    # may come free between two accepts (a reaper round closing a file), which ends one
    # episode and starts another; each episode still logs once, and far fewer lines than
    # the failures they count.
    episodes = log.count("out of file descriptors (limit 64)")
    failures = sum(int(n) for n in re.findall(r"available again after (\d+) failure", log))
    assert 1 <= episodes <= 3 and failures > episodes, log
    assert "maintenance step prune failed" not in log or "Traceback" not in log, log
    assert "file descriptors available again" in log, log
    assert d.stop() == 0, d.log()


def test_backup_out_of_fds_is_unavailable_not_internal(daemon_factory, tmp_path):
    """A backup asked for while coordd has no descriptor left answers `unavailable` with
    the reason, leaves nothing at DEST, and works once descriptors are free again."""
    d = daemon_factory()
    d.nofile = (LOW, LOW)
    d.start()
    dest = str(tmp_path / "b.db")
    idle: list[socket.socket] = []
    with SyncClient(d.socket, timeout=10) as c:
        c.status()
        try:
            for _ in range(LOW):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(d.socket)
                idle.append(s)
            time.sleep(0.5)  # coordd accepts them all (and refuses the ones past its limit)
            with pytest.raises(errors.Unavailable) as got:
                c.backup(dest)
            assert "out of file descriptors" in str(got.value), got.value
            assert not os.path.exists(dest) and not os.path.exists(dest + ".artifacts")
        finally:
            for s in idle:
                s.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                assert c.backup(dest).quick_check == "ok"
                break
            except errors.Unavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    assert "backup failed" not in d.log() and "Traceback" not in d.log(), d.log()
