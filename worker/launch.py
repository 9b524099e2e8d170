"""Start a model under a parent-death signal: the model dies with its supervisor.

The child sets ``PR_SET_PDEATHSIG`` (SIGKILL) on itself before it execs the model, in a
tiny ``python -I -S -c`` step rather than ``preexec_fn`` (not safe with threads,
OPS-FACTS 4.1). The signal is kept across exec and fires when the thread that spawned the
child ends: spawn from the event loop's thread, which lives as long as the supervisor.
A failed exec (ENOENT, EACCES, ...) comes back through a close-on-exec pipe as the
OSError the caller would have had from a direct spawn.

Where util-linux's ``setpriv`` is installed and the program is an ELF executable for this
machine or a ``#!`` script whose interpreter is one, ``fast_argv`` starts it with
``setpriv --pdeathsig KILL`` instead: the same signal for about 1.5 ms instead of ~30 ms of
Python start-up. The program is resolved and checked before the spawn, so ENOENT and EACCES
are raised as before; any other file takes the shim, which reports ENOEXEC exactly (setpriv
would hand it to /bin/sh).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
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


SETPRIV = shutil.which("setpriv")
_ELF_MAGIC = b"\x7fELF"
_ET_EXEC, _ET_DYN = 2, 3


def _elf_machine(head: bytes) -> int | None:
    """The e_machine of an ELF executable or shared object header, else None."""
    if len(head) < 20 or not head.startswith(_ELF_MAGIC) or head[4] not in (1, 2) \
            or head[6] != 1 or head[5] not in (1, 2):
        return None
    order = "little" if head[5] == 1 else "big"
    if int.from_bytes(head[16:18], order) not in (_ET_EXEC, _ET_DYN):
        return None
    return int.from_bytes(head[18:20], order)


def _read_head(path: str, size: int = 256) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return b""


_HOST_MACHINE = _elf_machine(_read_head("/proc/self/exe"))


def _runs_here(path: str, depth: int = 0) -> bool:
    """True if the kernel will exec `path` as it is: an ELF for this machine, or a ``#!``
    script (one level) whose interpreter is one."""
    head = _read_head(path)
    if head.startswith(b"#!") and depth == 0:
        line = head[2:].split(b"\n", 1)[0].strip()
        interp = line.split()[0].decode("utf-8", "replace") if line else ""
        return bool(interp) and os.path.isabs(interp) and os.access(interp, os.X_OK) \
            and _runs_here(interp, depth + 1)
    machine = _elf_machine(head)
    return machine is not None and machine == _HOST_MACHINE


def fast_argv(argv: list[str], env: dict[str, str]) -> list[str] | None:
    """``argv`` under ``setpriv --pdeathsig KILL``, or None where the shim must be used
    (no setpriv, or a program the kernel might refuse with ENOEXEC).

    Raises:
        ValueError: `argv` is empty.
        OSError: the program is not found on ``env``'s PATH (ENOENT) or not executable
            (EACCES), as a direct spawn would raise it.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    if SETPRIV is None or _HOST_MACHINE is None:
        return None
    program = argv[0]
    if os.sep in program:
        if not os.path.exists(program):
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        path = program
    else:
        path = shutil.which(program, mode=os.F_OK, path=env.get("PATH", os.defpath))
        if path is None:
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), program)
    if not _runs_here(path):
        return None
    return [SETPRIV, "--pdeathsig", "KILL", "--", path, *argv[1:]]


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
