"""The single-daemon lock of a database file, held on the file's identity, not on its name.

A database reached through another name (a symlink, a hard link, a bind mount, a relative
path or `..`) is the same file, and two coordd (or a coordd and a restore) on it would be
two writers with two artifact stores. So the lock is two `flock`s, both non-blocking:

- `<real path>.lock`, the lock file beside the resolved path (`os.path.realpath`), which
  also covers a database that does not exist yet (first start, restore onto nothing);
- the database file's own inode, which every name of the file shares (hard links too).

`flock` locks do not interact with the POSIX (`fcntl`) byte-range locks SQLite takes on
the same file (Linux local file systems; on NFS `flock` is emulated with `fcntl` locks:
keep the database on a local disk). Both locks die with the process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os

from coordd import errors

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"


def real_db_path(db_path: str | os.PathLike[str]) -> str:
    """The database's canonical path: absolute, `..` and symlinks resolved."""
    return os.path.realpath(os.fspath(db_path))


class DbLock:
    """Hold the lock of one database file (see the module doc) until `close()`.

    Args:
        db_path: the database, by any of its names.

    Raises:
        errors.InvalidState: another process (a running coordd, a restore) holds it;
            the message names both the path given and the file it resolves to.
        OSError: the lock file cannot be created (missing folder, permissions).
    """

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        self.given = os.fspath(db_path)
        self.real = real_db_path(db_path)
        self._fds: list[int] = []
        self._inode = False
        try:
            self._take(os.open(self.real + LOCK_SUFFIX,
                               os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            self.lock_inode()
        except BaseException:
            self.close()
            raise

    def lock_inode(self) -> None:
        """Lock the database file's inode too, once it exists (coordd calls this again
        after SQLite created a new file; nothing else can name a file not yet made)."""
        if self._inode:
            return
        try:
            fd = os.open(self.real, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        self._take(fd)
        self._inode = True
        links = os.fstat(fd).st_nlink
        if links > 1:
            logger.warning("database %s has %d hard links: use one name only (SQLite names "
                           "its -wal and -shm files after the path it was opened by)",
                           self.real, links, extra={"action": "db_hard_links"})

    def _take(self, fd: int) -> None:
        self._fds.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            shown = self.given if os.path.abspath(self.given) == self.real \
                else f"{self.given} (that is {self.real})"
            raise errors.InvalidState(
                f"{shown} is in use by another process (a running coordd or a restore)"
            ) from None

    def close(self) -> None:
        """Release both locks (idempotent)."""
        while self._fds:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop())

    def __enter__(self) -> DbLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
