"""Which configured kinds this worker can run: each kind's command is checked at start
(argv[0] resolvable and executable), and a kind whose spawn fails is set aside.

A broken kind is not advertised (its jobs are not claimed here), is named with its
reason in every heartbeat (`coordctl workers` shows it) and is checked again every
RECHECK_S: a fixed install comes back on its own. A kind whose spawn failed although the
check passed (`cannot_exec`: Exec format error, permission denied by a mount) comes back
only once its program file has changed (another inode, size, mode or mtime), so a kind
that cannot run costs one handed-back job per worker start, never a loop.
"""

from __future__ import annotations

import logging
import os
import shutil

from worker.config import PLACEHOLDERS, KindConfig, expand_argv

logger = logging.getLogger(__name__)

RECHECK_S = 60.0


def _program(kind: KindConfig) -> str | None:
    """The absolute path `kind`'s argv[0] names, or None when only its spawn can tell
    (a placeholder other than `{python}`, a relative path, a name not on PATH)."""
    raw = kind.argv[0]
    if any("{" + name + "}" in raw for name in PLACEHOLDERS):
        return None
    program = expand_argv([raw], {name: "" for name in PLACEHOLDERS})[0]
    if os.sep not in program:
        return shutil.which(program, path={**os.environ, **kind.env}.get("PATH", os.defpath))
    return program if os.path.isabs(program) else None


def _identity(path: str | None) -> tuple[int, ...] | None:
    """What changes when a program file is replaced or fixed; None if it cannot be read."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns)


def check(kind: KindConfig) -> str | None:
    """Why `kind`'s program cannot be started, or None if it looks runnable.

    `{python}` is expanded; a program named by another placeholder, or by a relative
    path (resolved in the job's folder), is left to the spawn to judge.
    """
    raw = kind.argv[0]
    if any("{" + name + "}" in raw for name in PLACEHOLDERS):
        return None
    program = expand_argv([raw], {name: "" for name in PLACEHOLDERS})[0]
    path_var = {**os.environ, **kind.env}.get("PATH", os.defpath)
    if os.sep not in program:
        found = shutil.which(program, path=path_var)
        return None if found else f"cannot execute {program}: not found on PATH ({path_var})"
    if not os.path.isabs(program):
        return None
    if not os.path.exists(program):
        return f"cannot execute {program}: no such file"
    if os.path.isdir(program):
        return f"cannot execute {program}: is a directory"
    if not os.access(program, os.X_OK):
        return f"cannot execute {program}: permission denied (not executable)"
    return None


class KindHealth:
    """The usable and broken kinds of one worker (times on the caller's monotonic clock)."""

    def __init__(self, kinds: dict[str, KindConfig], now: float) -> None:
        self._kinds = kinds
        self._broken: dict[str, str] = {}
        self._failed_exec: dict[str, tuple[int, ...]] = {}  # kind -> its program's identity
        self._next_check = now + RECHECK_S
        for name in sorted(kinds):
            reason = check(kinds[name])
            if reason is not None:
                self.set_broken(name, reason)

    def usable(self) -> list[str]:
        """The kinds to advertise and claim, sorted."""
        return sorted(k for k in self._kinds if k not in self._broken)

    def broken(self) -> dict[str, str]:
        """kind -> why it is not advertised."""
        return dict(self._broken)

    def is_broken(self, name: str) -> bool:
        """Whether `name` is set aside."""
        return name in self._broken

    def set_broken(self, name: str, reason: str) -> None:
        """Stop advertising `name` (loud: an operator must fix the worker's config)."""
        if self._broken.get(name) != reason:
            logger.error("kind %s is not usable on this worker, not claiming it: %s", name,
                         reason, extra={"action": "kind_broken", "kind": name, "reason": reason})
        self._broken[name] = reason

    def cannot_exec(self, name: str, reason: str) -> None:
        """`name`'s spawn failed (OSError from exec): set it aside like `set_broken`, and
        until its program file changes, when the check cannot see why (it passed)."""
        self.set_broken(name, reason)
        identity = _identity(_program(self._kinds[name]))
        if identity is not None:
            self._failed_exec[name] = identity

    def recheck(self, now: float) -> None:
        """Every RECHECK_S, advertise again each broken kind whose command now checks out."""
        if now < self._next_check or not self._broken:
            return
        self._next_check = now + RECHECK_S
        for name in sorted(self._broken):
            if check(self._kinds[name]) is not None:
                continue
            failed = self._failed_exec.get(name)
            if failed is not None and failed == _identity(_program(self._kinds[name])):
                continue  # the same file that could not be executed
            self._failed_exec.pop(name, None)
            logger.warning("kind %s is usable again (was: %s)", name, self._broken.pop(name),
                               extra={"action": "kind_usable", "kind": name})
