"""The content-addressed store: files kept as `<root>/<sha[:2]>/<sha256>`, written
crash-safely (temp name, fsync, rename, fsync of the folder) before any record of them.

Shared by the worker (checkpoints, large results) and coordd (backup and restore of the
artifact files). Blocking file I/O: call from a thread in async code.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass

CHUNK_BYTES = 1 << 20


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


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the whole new one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
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
    os.makedirs(root, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=root)
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
        created = not os.path.isdir(folder)
        os.makedirs(folder, exist_ok=True)
        if created:
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
    fresh file), it is put back (the bytes are the same, content-addressed) and kept.
    """
    if not os.path.isdir(root):
        return 0
    aside_dir = os.path.join(root, ".sweep")
    os.makedirs(aside_dir, exist_ok=True)
    removed = 0
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
    return removed
