"""Start a model under a parent-death signal: the model dies with its supervisor.

The child sets ``PR_SET_PDEATHSIG`` (SIGKILL) on itself before it execs the model, in a
tiny ``python -I -S -c`` step rather than ``preexec_fn`` (not safe with threads,
OPS-FACTS 4.1). The signal is kept across exec and fires when the thread that spawned the
child ends: spawn from the event loop's thread, which lives as long as the supervisor.
A failed exec (ENOENT, EACCES, ...) comes back through a close-on-exec pipe as the
OSError the caller would have had from a direct spawn.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys

PR_SET_PDEATHSIG = 1
EXEC_FAILED_EXIT = 127  # the shim's exit code when the model could not be executed

# argv: fd of the status pipe, the supervisor's pid, then the model's argv.
_SHIM = r"""
import os, signal, sys
fd, ppid, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
except Exception:
    pass
if os.getppid() != ppid:
    os._exit(1)
os.set_inheritable(fd, False)
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    os.write(fd, ("%d %s" % (exc.errno or 0, exc.strerror or exc)).encode())
    os._exit(127)
"""


def shim_argv(argv: list[str], status_fd: int) -> list[str]:
    """The command that runs `argv` under a parent-death SIGKILL (this process the parent).

    Raises:
        ValueError: `argv` is empty.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    return [sys.executable, "-I", "-S", "-c", _SHIM, str(status_fd), str(os.getpid()), *argv]


async def exec_error(read_fd: int, program: str) -> OSError | None:
    """Wait until the shim has exec'd the model (None) or reported why it could not (the
    OSError, as a direct spawn would raise it). `read_fd` is closed by the reading thread
    once it has read to the end, also when this wait is cancelled."""
    data = await asyncio.to_thread(_read_all, read_fd)
    if not data:
        return None
    code, _, text = data.decode("utf-8", "replace").partition(" ")
    num = int(code) if code.isdigit() else errno.EIO
    return OSError(num, text or os.strerror(num), program)


def _read_all(fd: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
