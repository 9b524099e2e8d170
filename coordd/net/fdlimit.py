"""File descriptors: raise the soft RLIMIT_NOFILE at start, tell fd exhaustion from other
errors, and log an exhaustion episode once (not once per failed accept or open).

An episode starts at the first EMFILE/ENFILE noted and ends at `note_ok()` (the listener
calls it when an accept succeeds again); its end is logged with how many failures it saw.
"""

from __future__ import annotations

import errno
import logging
import os
import resource

logger = logging.getLogger(__name__)

FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
OUT_OF_FDS = "coordd is out of file descriptors"  # the refusal's message; coordctl shows it


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one; return the (soft, hard) now in force.

    A failure (a hard limit the kernel will not grant) is logged and leaves the limit as it
    was: coordd still starts.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the file descriptor limit from %d to %d: %s",
                           soft, hard, exc, extra={"action": "nofile_limit"})
    return soft, hard


def is_exhaustion(exc: BaseException) -> bool:
    """True for EMFILE (this process) and ENFILE (the whole system)."""
    return isinstance(exc, OSError) and exc.errno in FD_ERRNOS


class _Episode:
    def __init__(self) -> None:
        self.active = False
        self.failures = 0


_episode = _Episode()


def note_exhaustion(exc: BaseException, where: str) -> bool:
    """If `exc` is fd exhaustion, count it (logging the first of an episode) and return
    True; otherwise return False and log nothing."""
    if not is_exhaustion(exc):
        return False
    _episode.failures += 1
    if not _episode.active:
        _episode.active = True
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        logger.error("out of file descriptors (limit %d) in %s: %s; new clients are refused "
                     "until some close (logged once per episode)", soft, where, exc,
                     extra={"action": "fd_exhausted", "where": where, "limit": soft})
    return True


def note_ok() -> None:
    """A descriptor could be had again: end the episode (logging how many failures it saw)."""
    if _episode.active:
        logger.warning("file descriptors available again after %d failure(s)",
                       _episode.failures, extra={"action": "fd_recovered",
                                                 "n": _episode.failures})
        _episode.active = False
        _episode.failures = 0


def warning() -> str | None:
    """A `status` warning while an fd exhaustion episode is on, else None."""
    if not _episode.active:
        return None
    return f"out of file descriptors (limit {current_limit()}): {_episode.failures} " \
           "accept/open failure(s); new clients are refused"


def out_of_fds() -> bool:
    """True when this process cannot open one more descriptor now (EMFILE/ENFILE): what
    an SQLite "unable to open database file" means then."""
    try:
        os.close(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        return is_exhaustion(exc)
    return False


def current_limit() -> int:
    """The soft RLIMIT_NOFILE in force."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
