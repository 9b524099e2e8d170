"""worker.child: spawned children are reaped on the loop (pidfd, or a thread without one),
on asyncio's loop and uvloop, with the exit code asyncio's Process would give."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import signal
import subprocess
import sys
import threading

import pytest
import uvloop

from worker import child

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(params=["pidfd", "thread"])
def waiting(request, monkeypatch):
    """Each test runs with pidfds and with the thread that stands in where they are refused."""
    if request.param == "thread":
        def refused(pid: int, flags: int = 0) -> int:
            raise OSError(errno.EPERM, "pidfd_open refused by seccomp")
        monkeypatch.setattr(os, "pidfd_open", refused)
    return request.param


def _run(loop_name: str, coro_fn):
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        return runner.run(coro_fn())


def _spawn(tmp_path, code: str) -> child.Child:
    out = os.open(tmp_path / "out.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        return child.spawn([sys.executable, "-S", "-c", code], env=dict(os.environ),
                           cwd=str(tmp_path), stdout=out, stderr=out)
    finally:
        os.close(out)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_exit_codes_of_concurrent_children_each_reach_their_own_waiter(tmp_path, waiting, loop_name):
    async def main():
        kids = [_spawn(tmp_path, f"import sys, time; time.sleep({0.05 * (i % 3)}); sys.exit({i})")
                for i in range(12)]
        codes = await asyncio.gather(*(k.wait() for k in kids))
        assert codes == list(range(12))
        assert [k.returncode for k in kids] == list(range(12))
        # reaped: the pids are no longer our children
        for k in kids:
            with pytest.raises(ChildProcessError):
                os.waitpid(k.pid, os.WNOHANG)
    _run(loop_name, main)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_returncode_is_set_without_a_waiter_and_a_cancelled_wait_leaves_it_watched(
        tmp_path, waiting, loop_name):
    async def main():
        quick = _spawn(tmp_path, "raise SystemExit(3)")
        slow = _spawn(tmp_path, "import time; time.sleep(0.3)")
        assert quick.returncode is None
        for _ in range(500):  # nobody waits on `quick`: the loop reaps it all the same
            if quick.returncode is not None:
                break
            await asyncio.sleep(0.01)
        assert quick.returncode == 3
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(slow.wait(), 0.01)
        assert await slow.wait() == 0
    _run(loop_name, main)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_without_a_pidfd_the_thread_only_learns_of_the_exit_and_the_loop_reaps(
        tmp_path, monkeypatch, loop_name):
    """The waiting thread must not reap: `returncode` would change off the loop's thread and
    the pid could be recycled between ModelProcess's `returncode is None` and its look at
    the pid (terminate_tree). Until the loop runs, the exited child stays our zombie."""
    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "no pidfd_open")
    monkeypatch.setattr(os, "pidfd_open", refused)

    async def main():
        kid = _spawn(tmp_path, "raise SystemExit(3)")
        waiter = next(t for t in threading.enumerate() if t.name == f"child-{kid.pid}")
        waiter.join(30)  # the loop does not run meanwhile
        assert not waiter.is_alive()
        assert kid.returncode is None
        status = os.waitid(os.P_PID, kid.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        assert (status.si_pid, status.si_status) == (kid.pid, 3)  # exited, not reaped
        assert await kid.wait() == 3
        assert kid.returncode == 3
        with pytest.raises(ChildProcessError):
            os.waitpid(kid.pid, os.WNOHANG)
    _run(loop_name, main)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_a_signal_death_reads_as_minus_the_signal(tmp_path, waiting, loop_name):
    async def main():
        kid = _spawn(tmp_path, "import time; time.sleep(30)")
        assert os.getpgid(kid.pid) == kid.pid  # its own session and group
        os.kill(kid.pid, signal.SIGKILL)
        assert await kid.wait() == -signal.SIGKILL
    _run(loop_name, main)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_an_exit_reaped_by_someone_else_never_reads_as_success(tmp_path, waiting, loop_name):
    """With SIGCHLD ignored the kernel reaps the child and waitpid says ECHILD: Popen.poll
    would call that exit 0, and the supervisor a success. The status is lost: 255, as
    asyncio's child watchers report it."""
    async def main():
        kid = _spawn(tmp_path, "raise SystemExit(3)")
        assert await kid.wait() == 255
        assert kid.returncode == 255
    ignored = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        _run(loop_name, main)
    finally:
        signal.signal(signal.SIGCHLD, ignored)


def _pidfds() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]":
                found.add(fd)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_a_child_still_running_when_its_loop_closes_leaves_no_pidfd_open(tmp_path, loop_name):
    """The closed loop drops the Child: Popen warns that the child still runs (and keeps it
    in subprocess._active to reap later); the pidfd must not stay open for the process's
    life."""
    before = _pidfds()
    pids = []

    async def main():
        pids.append(_spawn(tmp_path, "import time; time.sleep(60)").pid)
    try:
        with pytest.warns(ResourceWarning, match="still running"):
            _run(loop_name, main)
            gc.collect()
        assert _pidfds() == before
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_a_child_that_cannot_be_watched_is_killed_before_spawn_raises(tmp_path, monkeypatch):
    """No pidfd and no thread to spare (a pids cgroup at its limit): spawn raises, and the
    child it started must not run on unwatched, its exit never reaped."""
    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(errno.EPERM, "pidfd_open refused by seccomp")
    monkeypatch.setattr(os, "pidfd_open", refused)

    def no_thread(self) -> None:
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", no_thread)
    started = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]
    monkeypatch.setattr(subprocess, "Popen", recording_popen)

    async def main():
        with pytest.raises(RuntimeError, match="can't start new thread"):
            _spawn(tmp_path, "import time; time.sleep(60)")
    try:
        asyncio.run(main())
        assert len(started) == 1 and started[0].returncode == -signal.SIGKILL
    finally:
        for popen in started:
            popen.kill()
            popen.wait()


def test_a_program_that_cannot_run_raises_the_exec_error(tmp_path):
    async def main():
        with pytest.raises(FileNotFoundError):
            child.spawn([str(tmp_path / "missing")], env=dict(os.environ), cwd=str(tmp_path),
                        stdout=1, stderr=2)
        (tmp_path / "plain").write_text("not a program")
        with pytest.raises(PermissionError):
            child.spawn([str(tmp_path / "plain")], env=dict(os.environ), cwd=str(tmp_path),
                        stdout=1, stderr=2)
    asyncio.run(main())


def test_only_pass_fds_reach_the_child(tmp_path):
    async def main():
        kept_r, kept_w = os.pipe()
        other_r, other_w = os.pipe()
        try:
            kid = _spawn_with(tmp_path, kept_w, other_w)
            assert await kid.wait() == 0
        finally:
            for fd in (kept_r, kept_w, other_r, other_w):
                os.close(fd)
        assert (tmp_path / "fds").read_text() == "kept open, other closed"

    def _spawn_with(tmp_path, kept: int, other: int) -> child.Child:
        code = ("import os\n"
                "def ok(fd):\n"
                "    try: os.fstat(fd); return True\n"
                "    except OSError: return False\n"
                f"k, o = ok({kept}), ok({other})\n"
                "open('fds', 'w').write(('kept open' if k else 'kept closed') + ', '"
                " + ('other open' if o else 'other closed'))\n")
        return child.spawn([sys.executable, "-S", "-c", code], env=dict(os.environ),
                           cwd=str(tmp_path), stdout=1, stderr=2, pass_fds=(kept,))
    asyncio.run(main())
