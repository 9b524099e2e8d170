"""One model process tree: spawn it in its own session, signal the whole tree, reap it.

Why snapshot-then-signal: a helper that calls ``setsid()`` leaves the process group, so
``killpg`` alone misses it (CASES B26, OPS-FACTS 4.1). We record the descendants before the
first signal and SIGKILL any of them still alive at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

import psutil

from worker import launch
from worker.child import Child, spawn

logger = logging.getLogger(__name__)

EXIT_SUCCESS = 0
EXIT_RETRYABLE = 75
"""EX_TEMPFAIL (sysexits.h): the model process asks to be retried."""
STDERR_TAIL_BYTES_DEFAULT = 4000
REAP_POLL_S = 0.02
"""Poll interval while waiting for snapshot processes (not our children) to disappear."""
REAP_WAIT_S_DEFAULT = 2.0
"""How long ``terminate_tree`` waits for SIGKILLed non-children to vanish, seconds."""


def classify_exit(returncode: int, killed_by_us: bool) -> str:
    """Classify a model process's exit for the supervisor.

    Args:
        returncode: ``Process.returncode``; negative ``-N`` means killed by signal N.
        killed_by_us: True if the supervisor signalled the tree.

    Returns:
        ``"success"`` for 0; ``"retryable"`` for 75 (EX_TEMPFAIL) or a signal we did not send;
        ``"killed"`` for a signal we sent (also a shell's ``128+N`` after our signal);
        ``"permanent"`` for anything else.
    """
    if returncode == EXIT_SUCCESS:
        return "success"
    if returncode == EXIT_RETRYABLE:
        return "retryable"
    if killed_by_us and (returncode < 0 or returncode > 128):
        return "killed"
    if returncode < 0:
        return "retryable"
    return "permanent"


def _snapshot(roots: list[psutil.Process]) -> dict[int, psutil.Process]:
    """Return the roots still running and all their descendants, keyed by pid.

    Roots are ``psutil.Process`` objects, not pids, so a recycled pid is never mistaken for
    one of ours (``is_running`` compares start times).
    """
    found: dict[int, psutil.Process] = {}
    for root in roots:
        try:
            if not root.is_running():
                continue
            found.setdefault(root.pid, root)
            for child in root.children(recursive=True):
                found.setdefault(child.pid, child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _alive(proc: psutil.Process) -> bool:
    """True if ``proc`` (same pid and start time) exists and is not a zombie."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is already empty
    except PermissionError:
        logger.warning("killpg denied", extra={"action": "killpg_denied", "pgid": pgid, "signal": sig.name})


def _kill_tree(pgid: int, leader: psutil.Process | None, tree: dict[int, psutil.Process]) -> None:
    """SIGKILL the group, then every process of ``tree`` (plus new descendants) still alive."""
    # Helpers started during the grace period are caught by a second look.
    roots = [leader, *tree.values()] if leader is not None else list(tree.values())
    for pid, proc in _snapshot(roots).items():
        if pid != pgid:
            tree.setdefault(pid, proc)
    _killpg(pgid, signal.SIGKILL)
    for proc in tree.values():
        if not _alive(proc):
            continue
        try:
            proc.kill()  # psutil checks for pid reuse first
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
        except psutil.AccessDenied:
            logger.warning("cannot kill escaped helper", extra={"action": "kill_denied", "pid": proc.pid})


class ModelProcess:
    """A running model process, leader of its own session and process group."""

    def __init__(self, proc: Child, stderr_path: str) -> None:
        """Wrap an already spawned process; use ``ModelProcess.start`` instead."""
        self._proc = proc
        self._stderr_path = stderr_path
        self._killed_by_us = False
        self._tree_done = False
        self._stopped = False
        self._stopped_at = 0.0  # monotonic, while stopped
        self._stopped_total = 0.0
        self._lock = asyncio.Lock()

    @classmethod
    async def start(
        cls, argv: list[str], env: dict[str, str], cwd: str, stdout_path: str, stderr_path: str
    ) -> ModelProcess:
        """Spawn ``argv`` in a new session with output going to files.

        Files rather than pipes, so a chatty model never blocks on a full pipe we fail to drain.
        The model gets SIGKILL if this process dies (worker.launch).

        Args:
            argv: Program and arguments; ``argv[0]`` is looked up on ``PATH`` from ``env``.
            env: The complete environment of the child.
            cwd: Working directory of the child.
            stdout_path: File that receives stdout (truncated).
            stderr_path: File that receives stderr (truncated).

        Returns:
            The started process.

        Raises:
            ValueError: If ``argv`` is empty.
            OSError: If a log file cannot be opened or the program cannot be executed.
        """
        if not argv:
            raise ValueError("argv must not be empty")
        fast = launch.fast_argv(argv, env)  # the model dies with us: worker.launch
        if fast is not None:
            with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
                proc = spawn(fast, env=env, cwd=cwd, stdout=out.fileno(), stderr=err.fileno())
        else:
            proc = await _start_shimmed(argv, env, cwd, stdout_path, stderr_path)
        logger.info("model process started", extra={"action": "model_start", "pid": proc.pid, "argv0": argv[0]})
        return cls(proc, stderr_path)

    @property
    def pid(self) -> int:
        """The leader's pid, which is also its process group and session id."""
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The leader's exit code once reaped, else None."""
        return self._proc.returncode

    @property
    def killed_by_us(self) -> bool:
        """True once ``terminate_tree`` signalled a still-running leader."""
        return self._killed_by_us

    async def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the leader to exit and reap it.

        Args:
            timeout: Seconds to wait, or None to wait forever.

        Returns:
            The return code, or None if the leader is still running after ``timeout``.
        """
        if self._proc.returncode is not None:
            return self._proc.returncode
        if timeout is None:
            return await self._proc.wait()
        try:
            return await asyncio.wait_for(self._proc.wait(), timeout)
        except TimeoutError:
            return None

    @property
    def stopped(self) -> bool:
        """True between `suspend` and `resume` (or the end of the tree)."""
        return self._stopped

    def stopped_s(self, now: float) -> float:
        """Seconds the group spent stopped by `suspend` so far (`now`: monotonic)."""
        return self._stopped_total + (now - self._stopped_at if self._stopped else 0.0)

    def suspend(self, now: float) -> bool:
        """SIGSTOP the model's whole group at monotonic `now`; False if it has ended."""
        if self._tree_done or self._proc.returncode is not None:
            return False
        _killpg(self._proc.pid, signal.SIGSTOP)
        if not self._stopped:
            self._stopped, self._stopped_at = True, now
        return True

    def resume(self, now: float) -> bool:
        """SIGCONT the model's whole group at monotonic `now`; False if it has ended."""
        if self._tree_done or self._proc.returncode is not None:
            return False
        _killpg(self._proc.pid, signal.SIGCONT)
        self._stopped_total = self.stopped_s(now)
        self._stopped = False
        return True

    async def terminate_tree(self, grace_s: float) -> None:
        """Stop the whole tree: SIGCONT + SIGTERM the group, wait ``grace_s``, SIGKILL group and
        snapshot, reap.

        Idempotent and safe after the leader has exited on its own.

        Args:
            grace_s: Seconds the leader gets to exit after SIGTERM.

        Raises:
            ValueError: If ``grace_s`` is negative.
        """
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        async with self._lock:
            if self._tree_done:
                return
            pgid = self._proc.pid
            leader: psutil.Process | None = None
            if self._proc.returncode is None:
                with contextlib.suppress(psutil.Error):
                    leader = psutil.Process(pgid)  # not reaped yet, so the pid is still ours
            tree = _snapshot([leader]) if leader is not None else {}
            tree.pop(pgid, None)  # the leader is reaped by worker.child, on the loop, not psutil
            running = self._proc.returncode is None
            if running:
                self._killed_by_us = True
            # after the leader's own exit this only sweeps up what it left: not news at INFO
            logger.log(
                logging.INFO if running else logging.DEBUG,
                "terminating model tree" if running else "model exited; sweeping its process group",
                extra={"action": "model_terminate", "pid": pgid, "descendants": sorted(tree)},
            )
            # a stopped group (suspended by us or anyone) would sit on SIGTERM for the grace
            _killpg(pgid, signal.SIGCONT)
            self._stopped = False
            _killpg(pgid, signal.SIGTERM)
            try:
                if await self.wait(grace_s) is None:
                    logger.info("grace expired, killing", extra={"action": "model_kill", "pid": pgid})
            finally:  # also when our caller is cancelled mid-grace: never leave the tree running
                _kill_tree(pgid, leader, tree)
            await self._proc.wait()
            await self._await_gone(list(tree.values()), REAP_WAIT_S_DEFAULT)
            self._tree_done = True

    async def _await_gone(self, procs: list[psutil.Process], timeout_s: float) -> None:
        """Wait until each process is gone or a zombie (its parent, not us, must reap it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        alive = [p for p in procs if _alive(p)]
        while alive and loop.time() < deadline:
            await asyncio.sleep(REAP_POLL_S)
            alive = [p for p in alive if _alive(p)]
        if alive:
            logger.warning(
                "processes survived SIGKILL",
                extra={"action": "model_survivors", "pids": [p.pid for p in alive]},
            )

    def stderr_tail(self, max_bytes: int = STDERR_TAIL_BYTES_DEFAULT) -> str:
        """Return the last ``max_bytes`` bytes of stderr, decoded as UTF-8 with replacement.

        Args:
            max_bytes: Upper bound on bytes read from the end of the file.

        Returns:
            The text, or "" if the file is missing.
        """
        try:
            with open(self._stderr_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - max_bytes))
                data = fh.read(max_bytes)
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace")


async def _start_shimmed(argv: list[str], env: dict[str, str], cwd: str, stdout_path: str,
                         stderr_path: str) -> Child:
    """Spawn ``argv`` through worker.launch's Python shim; raise the exec's OSError."""
    status_r, status_w = os.pipe()
    try:
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = spawn(launch.shim_argv(argv, status_w), env=env, cwd=cwd,
                         stdout=out.fileno(), stderr=err.fileno(), pass_fds=(status_w,))
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    failed = await launch.exec_error(status_r, argv[0])
    if failed is not None:
        await proc.wait()
        raise failed
    return proc
