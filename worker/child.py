"""Spawn a child with vfork and reap it through a pidfd on the running loop.

``asyncio.create_subprocess_exec`` under uvloop forks the whole interpreter and runs its
at-fork handlers in the child (a fresh epoll, io_uring and signal table) before the exec,
and the loop's thread waits for that exec: about 2.8 ms a spawn on the bench machine, where
``subprocess.Popen`` (vfork, then exec) returns in 0.3 ms (docs/decisions.md, "vfork").
The exit is watched through ``os.pidfd_open`` (Linux 5.3) on the loop: no thread, no SIGCHLD
handler, and the pid cannot be mistaken for a recycled one. Where the kernel or a seccomp
profile refuses a pidfd, one thread per child waits for the exit instead (waitid with
WNOWAIT: it does not reap) and hands the reap to the loop, so either way `returncode` only
changes on the loop's thread and an exited child's pid stays ours until then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import threading

logger = logging.getLogger(__name__)

LOST_EXIT_CODE = 255
"""The exit code of a child someone else reaped (SIGCHLD ignored, a ``waitpid(-1)``): its
status is lost. asyncio's child watchers report the same; Popen.poll would say 0."""


class Child:
    """A spawned child process: `pid`, `returncode` (None until reaped) and `wait()`.

    The exit is reaped as soon as it happens, whether or not anyone waits, so `returncode`
    is current whenever the loop runs (the way asyncio's Process behaves).
    """

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        """Watch `popen`'s exit on `loop`; use `spawn` instead."""
        self._popen = popen
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = -1
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError) as exc:  # no pidfd_open (old kernel, seccomp)
            logger.debug("no pidfd, a thread waits", extra={"action": "child_wait_thread",
                                                           "pid": popen.pid, "error": str(exc)})
            threading.Thread(target=self._wait_in_thread, name=f"child-{popen.pid}",
                             daemon=True).start()
        else:
            loop.add_reader(self._pidfd, self._reap)

    def __del__(self, _close=os.close) -> None:
        """Collected unreaped (its loop was closed first): close the pidfd. Popen warns that
        the child still runs and keeps it in ``subprocess._active`` to reap later."""
        if getattr(self, "_pidfd", -1) >= 0:
            _close(self._pidfd)
            self._pidfd = -1

    @property
    def pid(self) -> int:
        """The child's pid."""
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once reaped (``-N`` for signal N; `LOST_EXIT_CODE` if someone else
        reaped it), else None."""
        return self._popen.returncode

    async def wait(self) -> int:
        """The exit code, once the child has exited and been reaped. Cancelling the wait
        leaves the child watched."""
        return await asyncio.shield(self._exited)

    def _reap(self) -> None:
        """The child has exited (its pidfd is readable, or the waiting thread says so): reap
        it (waitpid) on the loop's thread and wake the waiters."""
        if self._popen.returncode is None:
            try:
                pid, status = os.waitpid(self._popen.pid, os.WNOHANG)
            except ChildProcessError:
                logger.warning("child %d was reaped by someone else: exit status lost, reported "
                               "as %d", self._popen.pid, LOST_EXIT_CODE,
                               extra={"action": "child_status_lost", "pid": self._popen.pid})
                self._popen.returncode = LOST_EXIT_CODE
            else:
                if pid == 0:
                    return
                self._popen.returncode = os.waitstatus_to_exitcode(status)
        if self._pidfd >= 0:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        if not self._exited.done():
            self._exited.set_result(self._popen.returncode)

    def _wait_in_thread(self) -> None:
        """Block until the child has exited, without reaping it (WNOWAIT), then hand the reap
        to the loop: `returncode` changes on the loop's thread only, as with a pidfd, and the
        pid stays ours (a zombie, not recycled) until the loop reaps it."""
        try:
            os.waitid(os.P_PID, self._popen.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # reaped by someone else: _reap reports it
            pass
        try:
            self._loop.call_soon_threadsafe(self._reap)
        except RuntimeError:  # the loop was closed meanwhile: nobody waits; leave no zombie
            self._popen.poll()


def spawn(argv: list[str], *, env: dict[str, str], cwd: str, stdout: int, stderr: int,
          pass_fds: tuple[int, ...] = ()) -> Child:
    """Start `argv` in a new session with stdin from /dev/null; watch it on the running loop.

    Args:
        argv: Program and arguments; ``argv[0]`` is looked up on ``env``'s PATH.
        env: The complete environment of the child.
        cwd: The child's working directory.
        stdout, stderr: File descriptors the child writes to.
        pass_fds: Descriptors the child inherits (all others are closed).

    Returns:
        The started child.

    Raises:
        OSError: The program cannot be executed (as the exec reported it).
        RuntimeError: No running event loop; or no thread could be started to watch the
            child where a pidfd is refused (the child is killed and reaped first).
    """
    loop = asyncio.get_running_loop()
    popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                             cwd=cwd, env=env, start_new_session=True, pass_fds=pass_fds)
    try:
        return Child(popen, loop)
    except BaseException:  # not watched (no thread to spare): it must not run on unreaped
        os.killpg(popen.pid, signal.SIGKILL)  # its own group: with what it started already
        popen.wait()
        raise


KEPT_IGNORED = frozenset({signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP})
"""Ignored signals `restore_default_signals` leaves as they are: SIGPIPE and SIGXFSZ are
Python's own (Popen gives the child their defaults), SIGHUP the worker's own until its
loop handles it (coordd.process_start.ignore_sighup_until_handled)."""


def restore_default_signals() -> None:
    """Undo every SIG_IGN the worker inherited (exec keeps them: a parent's ``trap '' CHLD``,
    a background job of a non-interactive shell with SIGINT and SIGQUIT ignored, some
    process supervisors), but `KEPT_IGNORED`. An ignored SIGCHLD makes the kernel reap our
    models itself, so their exit codes are lost (`LOST_EXIT_CODE`); any other would pass on
    to every model, which Popen starts with the worker's dispositions (uvloop's spawn used
    to reset them all and install a SIGCHLD handler). Call it on the main thread before the
    first spawn (worker.__main__)."""
    for sig in signal.valid_signals():
        if sig in KEPT_IGNORED or sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # a real-time signal libc keeps for itself
            continue
