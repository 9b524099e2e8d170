"""`python -m coordctl ARGS` as a real process, without paying its imports at every call.

A zygote process imports coordctl's modules once; each `run()` sends it argv, env, cwd and
three pipe ends (SCM_RIGHTS), and it forks a handler that forks the coordctl process: fds
0-2 are the pipes, the cwd and environment are the caller's, and coordctl/__main__.py runs
as `python -m` runs it (runpy, `__main__`), exiting through the interpreter's normal exit.
The handler reports the pid, then the exit status (negative: the signal, as subprocess
does). Each call costs a fork instead of ~0.3 s of CPU for the imports.

The zygote starts on first use and ends with the test process (or when it sees its parent
gone). Only for tests: argv, exit codes, stdout and stderr are those of `python -m coordctl`.
`CTLFORK=0` in the environment runs `python -m coordctl` itself instead (to compare).
"""

from __future__ import annotations

import atexit
import json
import os
import pkgutil
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

MAX_REQUEST = 1 << 20
STARTUP_VARS = ("PYTHON", "LC_", "LANG")  # read once as an interpreter starts
START_TIMEOUT_S = 20.0

_lock = threading.Lock()
_zygote: tuple[subprocess.Popen[bytes], str] | None = None


def _start() -> str:
    """The zygote's socket path (started on first use)."""
    global _zygote
    with _lock:
        if _zygote is not None and _zygote[0].poll() is None:
            return _zygote[1]
        folder = tempfile.mkdtemp(prefix="ctlfork-")
        path = os.path.join(folder, "zygote.sock")
        proc = subprocess.Popen([sys.executable, "-m", "tests.ctlfork", path],
                                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the coordctl zygote did not start ({proc.poll()})")
            time.sleep(0.01)
        _zygote = (proc, path)
        atexit.register(_stop, proc, folder)
        return path


def _stop(proc: subprocess.Popen[bytes], folder: str) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)


def run(argv: list[str], *, input: str | None = None, cwd: str | None = None,
        env: dict[str, str] | None = None, timeout: float | None = None
        ) -> subprocess.CompletedProcess[str]:
    """As `subprocess.run([sys.executable, "-m", "coordctl", *argv], capture_output=True,
    text=True, ...)`; raises subprocess.TimeoutExpired (the process killed) likewise."""
    env = dict(os.environ if env is None else env)
    startup = {k: v for k, v in env.items() if k.startswith(STARTUP_VARS)}
    if os.environ.get("CTLFORK") == "0" or startup != {
            k: v for k, v in os.environ.items() if k.startswith(STARTUP_VARS)}:
        # the plain way: to compare, or where the interpreter's start would differ
        return subprocess.run([sys.executable, "-m", "coordctl", *argv], capture_output=True,
                              text=True, input=input, cwd=cwd, env=env, timeout=timeout)
    path = _start()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    req = json.dumps({"argv": argv, "cwd": os.path.abspath(cwd or os.getcwd()),
                      "env": env}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        socket.send_fds(conn, [req], [in_r, out_w, err_w])
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    deadline = None if timeout is None else time.monotonic() + timeout
    feeder = threading.Thread(target=_feed, args=(in_w, (input or "").encode()), daemon=True)
    feeder.start()
    out, err, status = bytearray(), bytearray(), bytearray()
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ, out)
    sel.register(err_r, selectors.EVENT_READ, err)
    sel.register(conn, selectors.EVENT_READ, status)
    try:
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                _kill(status)
                raise subprocess.TimeoutExpired([sys.executable, "-m", "coordctl", *argv],
                                                timeout, bytes(out), bytes(err))
            for key, _ in sel.select(left):
                data = conn.recv(65536) if key.fileobj is conn else os.read(key.fd, 65536)
                if data:
                    key.data.extend(data)
                else:
                    sel.unregister(key.fileobj)
    finally:
        sel.close()
        os.close(out_r)
        os.close(err_r)
        conn.close()
        feeder.join(5)
    code = json.loads(bytes(status).splitlines()[-1])["code"]
    return subprocess.CompletedProcess([sys.executable, "-m", "coordctl", *argv], code,
                                       out.decode(), err.decode())


def _feed(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _kill(status: bytearray) -> None:
    lines = bytes(status).splitlines()
    if lines:
        try:
            os.kill(json.loads(lines[0])["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- the zygote

def _serve(path: str) -> None:
    import coordctl
    for mod in pkgutil.walk_packages(coordctl.__path__, "coordctl."):
        if mod.name != "coordctl.__main__":
            __import__(mod.name)
    import coordctl.__main__  # noqa: F401 - its imports; it runs afresh as __main__
    del sys.modules["coordctl.__main__"]
    import coordd.client  # noqa: F401
    parent = os.getppid()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".tmp")
    srv.listen(64)
    os.rename(path + ".tmp", path)
    srv.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    while os.getppid() == parent:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        msg, fds, _flags, _addr = socket.recv_fds(conn, MAX_REQUEST, 3)
        if os.fork() == 0:
            srv.close()
            _handle(conn, json.loads(msg), fds)  # never returns here
        conn.close()
        for fd in fds:
            os.close(fd)


def _handle(conn: socket.socket, req: dict[str, Any], fds: list[int]) -> None:
    """In the handler: fork coordctl, report its pid and exit status, end."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _coordctl(req, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    conn.close()
    os._exit(0)


def _coordctl(req: dict[str, Any], fds: list[int]) -> None:
    """In the coordctl process: become `python -m coordctl ARGV`; exits through SystemExit
    (the interpreter's own exit: atexit, flushes), never returns."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    time.tzset()  # TZ, as a fresh interpreter reads it
    sys.argv = [os.path.join(os.path.dirname(sys.modules["coordctl"].__file__), "__main__.py"),
                *req["argv"]]
    runpy.run_module("coordctl", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


if __name__ == "__main__":
    _serve(sys.argv[1])
