"""Which configured kinds this worker can run: each kind's command is checked at start
(argv[0] resolvable and executable), and a kind whose spawn fails is set aside.

A broken kind is not advertised (its jobs are not claimed here), is named with its
reason in every heartbeat (`coordctl workers` shows it) and is checked again every
RECHECK_S: a fixed install comes back on its own, and a kind that keeps failing costs
at most one handed-back job per RECHECK_S, never a hot loop.
"""

from __future__ import annotations

import logging
import os
import shutil

from worker.config import PLACEHOLDERS, KindConfig, expand_argv

logger = logging.getLogger(__name__)

RECHECK_S = 60.0


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

    def recheck(self, now: float) -> None:
        """Every RECHECK_S, advertise again each broken kind whose command now checks out."""
        if now < self._next_check or not self._broken:
            return
        self._next_check = now + RECHECK_S
        for name in sorted(self._broken):
            if check(self._kinds[name]) is None:
                logger.warning("kind %s is usable again (was: %s)", name, self._broken.pop(name),
                               extra={"action": "kind_usable", "kind": name})
