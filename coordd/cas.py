"""The content-addressed store: files kept as `<root>/<sha[:2]>/<sha256>`, written
crash-safely (temp name, fsync, rename, fsync of the folder) before any record of them.

Shared by the worker (checkpoints, large results) and coordd (backup and restore of the
artifact files). Blocking file I/O: call from a thread in async code. The store may be
shared by two users in one group (coordd, workers): every file is written FILE_MODE and
every folder STORE_DIR_MODE, whatever the writer's umask (docs/guides/systemd.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
FILE_MODE = 0o640
"""Files written here: the owner writes, the group (coordd and its workers) reads."""
STORE_DIR_MODE = 0o2770
"""Folders of the store: the group may add and delete (prune) files; setgid keeps the group."""


@dataclass(frozen=True)
class StoredFile:
    """A file in the store."""

    path: str
    sha256: str
    size: int


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename or create in it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir(path: str) -> bool:
    """Create the folder `path` (and missing parents) with STORE_DIR_MODE; True if this call
    created it. A folder made by someone else keeps its mode (only its owner may change it).
    """
    if os.path.isdir(path):
        return False
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    os.chmod(path, STORE_DIR_MODE)  # past the umask (mkdir applies it)
    return True


def _temp_file(directory: str) -> tuple[int, str]:
    """A new temp file in `directory` with FILE_MODE (mkstemp makes 0600): (fd, path)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (mode FILE_MODE) so a reader sees the old file or the
    whole new one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = _temp_file(directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def sha256_file(path: str) -> tuple[str, int]:
    """Return (hex sha256, size) of the file at `path`."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def store_file(root: str, src: str) -> StoredFile:
    """Copy `src` into the store under `root` and return where it lives.

    The copy is hashed while it is written, so a file changing under us is stored under the
    hash of the bytes actually copied. A file of the same hash is replaced by the new copy
    (same bytes, fresh mtime: `sweep` relies on that).

    Raises:
        OSError: `src` vanished or the store is not writable.
    """
    make_dir(root)
    fd, tmp = _temp_file(root)
    h = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            while chunk := inp.read(CHUNK_BYTES):
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        sha = h.hexdigest()
        folder = os.path.join(root, sha[:2])
        if make_dir(folder):
            fsync_dir(root)
        dest = os.path.join(folder, sha)
        os.rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)
    return StoredFile(path=dest, sha256=sha, size=size)


def sweep(root: str, referenced: set[str], before: float) -> int:
    """Delete the store's files that no record refers to and that were last written before
    `before` (Unix seconds); return how many.

    Safe beside writers: a candidate is first renamed aside; if what was renamed turns out
    to be fresh (a writer stored the same content meanwhile, which `store_file` does with a
    fresh file), it is put back (the bytes are the same, content-addressed) and kept. A file
    in a folder this process may not change is kept and logged (one line per sweep).
    """
    if not os.path.isdir(root):
        return 0
    aside_dir = os.path.join(root, ".sweep")
    make_dir(aside_dir)
    removed = 0
    denied: list[str] = []
    for sub in sorted(os.listdir(root)):
        folder = os.path.join(root, sub)
        if len(sub) != 2 or not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name in referenced or name.startswith("."):
                continue
            path, aside = os.path.join(folder, name), os.path.join(aside_dir, name)
            try:
                if os.stat(path).st_mtime >= before:
                    continue
                os.rename(path, aside)
                if os.stat(aside).st_mtime >= before:
                    os.rename(aside, path)
                    continue
                os.unlink(aside)
                removed += 1
            except FileNotFoundError:
                continue
            except PermissionError:
                denied.append(path)
    if denied:
        logger.warning("artifact sweep: %d unreferenced file(s) not deleted (permission "
                       "denied; folders must be mode %o, group-writable), e.g. %s",
                       len(denied), STORE_DIR_MODE, denied[0],
                       extra={"action": "artifact_sweep_denied", "n": len(denied)})
    return removed
