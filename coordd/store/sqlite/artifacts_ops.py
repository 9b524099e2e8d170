"""Artifacts on SQLite (coordd.store.api_artifacts.ArtifactStore): files in the
content-addressed store beside the database (coordd.cas), the lease fence on the read pool.

Uploads gather in `<store>/.uploads/<sha>.part` and enter the store (`<sha[:2]>/<sha>`)
only once their SHA-256 and size are the ones announced. File I/O runs in a thread, never
in the writer's transaction. A put stamps the file's mtime with the store's `now`: the
sweep (coordd.cas.sweep) judges freshness by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from coordd import cas, errors
from coordd.store.sqlite import leases
from coordd.store import views
from coordd.paths import artifact_dir_for
from coordd.ops.metrics import tree_bytes
from coordd.wire.protocol import ArtifactRef
from coordd.wire.transfers import ArtifactData, ArtifactPutResult
from coordd.store.api import LeaseRef
from coordd.store.api_artifacts import stored_with_other_size

UPLOADS = ".uploads"


def stored_path(root: str, sha256: str) -> str:
    """Where the artifact `sha256` lives in the store at `root`."""
    return os.path.join(root, sha256[:2], sha256)


def _touch(path: str, at: float | None) -> None:
    os.utime(path, None if at is None else (at, at))


def put_chunk(root: str, sha256: str, size: int, offset: int, data: bytes,
              at: float | None = None) -> ArtifactPutResult:
    """Blocking: take one chunk of an upload into the store at `root` (see
    ArtifactStore.artifact_put); `at` stamps the stored file (None: the system's time).
    Raises: errors.BadRequest (the finished file does not hash as announced, or the
    artifact is stored with another size)."""
    dest = stored_path(root, sha256)
    held = held_file(root, sha256)
    if held is not None:  # stored already (a resend, or the same bytes)
        if held.size != size:
            raise errors.BadRequest(stored_with_other_size(sha256, held.size, size))
        _touch(dest, at)  # fresh: prune's sweep keeps it
        return ArtifactPutResult(received=size, done=True, path=dest)
    folder = os.path.join(root, UPLOADS)
    cas.make_dir(root)
    cas.make_dir(folder)
    part = os.path.join(folder, sha256 + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, cas.FILE_MODE)
    try:
        have = os.fstat(fd).st_size
        if have > size:  # a stale part of another size: start over
            os.ftruncate(fd, 0)
            have = 0
        if offset != have:
            return ArtifactPutResult(received=have)
        os.lseek(fd, have, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        have += len(data)
        if have < size:
            return ArtifactPutResult(received=have)
        os.fsync(fd)
    finally:
        os.close(fd)
    sha, got = cas.sha256_file(part)
    if (sha, got) != (sha256, size):
        os.unlink(part)
        raise errors.BadRequest(f"the uploaded file hashes to {sha[:12]}/{got} bytes, not "
                                f"the announced {sha256[:12]}/{size}; send it again")
    sub = os.path.dirname(dest)
    if cas.make_dir(sub):
        cas.fsync_dir(root)
    _touch(part, at)
    os.rename(part, dest)
    cas.fsync_dir(sub)
    return ArtifactPutResult(received=got, done=True, path=dest)


def held_file(root: str, sha256: str) -> ArtifactRef | None:
    """Blocking: the stored file of `sha256` in the store at `root` as a reference (its
    size and path), or None where there is none."""
    path = stored_path(root, sha256)
    try:
        size = os.stat(path).st_size
    except (FileNotFoundError, NotADirectoryError):
        return None
    return ArtifactRef(sha256=sha256, size=size, path=path)


def read_range(root: str, sha256: str, offset: int, limit: int) -> ArtifactData:
    """Blocking: up to `limit` bytes from `offset` of a stored file and its size.
    Raises: errors.NotFound."""
    try:
        with open(stored_path(root, sha256), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(offset)
            return ArtifactData(data=fh.read(limit), size=size)
    except FileNotFoundError:
        raise errors.NotFound(f"artifact {sha256[:12]} is not in coordd's store") from None


class SQLiteArtifactOps:
    """ArtifactStore over the store's file folder and read pool (a mixin: SQLiteStore has
    `path`, `readers` and `_now`)."""

    path: str
    readers: Any
    _now: Any

    @property
    def artifact_dir(self) -> str:
        """The content-addressed store beside the database (coordd.paths.artifact_dir_for)."""
        return artifact_dir_for(self.path)

    def make_artifact_dir(self) -> None:
        """Blocking: the artifact folder, made where it is missing (setgid, group-writable:
        workers of group coordd write into it too); left alone where it cannot be made."""
        with contextlib.suppress(OSError):
            cas.make_dir(self.artifact_dir)

    async def _artifact_fence(self, ref: LeaseRef, t: float) -> None:
        await self.readers.run(leases._check_lease, t, ref.job_id, ref.worker_id, ref.token)

    async def artifact_put(self, ref: LeaseRef, sha256: str, size: int, offset: int,
                           data: bytes, *, now: float | None = None) -> ArtifactPutResult:
        """Fence on the read pool, then `put_chunk` in a thread."""
        t = self._now(now)
        await self._artifact_fence(ref, t)
        return await asyncio.to_thread(put_chunk, self.artifact_dir, sha256, size, offset,
                                       data, t)

    async def artifact_get(self, ref: LeaseRef, sha256: str, offset: int, limit: int, *,
                           now: float | None = None) -> ArtifactData:
        """Fence on the read pool, then `read_range` in a thread."""
        await self._artifact_fence(ref, self._now(now))
        return await asyncio.to_thread(read_range, self.artifact_dir, sha256, offset, limit)

    async def artifact_held(self, sha256: str) -> ArtifactRef | None:
        """`held_file` in a thread (the file, whatever the artifacts table records)."""
        return await asyncio.to_thread(held_file, self.artifact_dir, sha256)

    async def artifact_refs(self) -> dict[str, str]:
        """coordd.store.views.artifact_refs on the read pool (a heavy read)."""
        return await self.readers.run(views.artifact_refs, heavy=True)

    async def artifact_sweep(self, before: float, *, now: float | None = None) -> int:
        """coordd.cas.sweep of the files `artifact_refs` does not name."""
        refs = await self.artifact_refs()
        return await asyncio.to_thread(cas.sweep, self.artifact_dir, set(refs), before)

    async def artifact_bytes(self) -> int:
        return await asyncio.to_thread(tree_bytes, self.artifact_dir)
