"""Files that travel over the connection (issue 18): a worker that does not share coordd's
artifact folder (a remote one; any on a PostgreSQL store, which names none) puts its large
results and checkpoints into coordd's artifact store (`artifact_put`), and reads a job's
checkpoint back when it resumes it (`artifact_get`). Nothing depends on a shared filesystem.

Uploads are chunked, resumable and hashed: each call says where coordd stands (a worker
that reconnects resends from there), and the file enters the store only once its SHA-256
and size are the ones announced. Both methods are fenced like `checkpoint` (job, worker,
token, unexpired lease), so only a lease holder can put bytes into coordd's store. The
checks of the request are made here; the store keeps the bytes (coordd.store.
api_artifacts: on SQLite files beside the database, file I/O in a thread; on PostgreSQL
rows every coordd of the deployment reads).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from coordd import errors
from coordd.config import Config
from coordd.wire.protocol import ArtifactRef
from coordd.wire.transfers import ArtifactData, ArtifactGet, ArtifactPut, ArtifactPutResult
from coordd.store.api import LeaseRef
from coordd.store.api_artifacts import not_held
from coordd.service.checks import lease_ref

TRANSFER_METHODS = ("artifact_put", "artifact_get")
CHUNK_MAX_BYTES = 4 << 20
_SHA = re.compile(r"[0-9a-f]{64}")


class _Turn:
    """The puts of one sha256 in flight: their lock and how many hold or wait on it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class Transfers:
    """`artifact_put` / `artifact_get` over the store's artifacts
    (coordd.store.api_artifacts: files beside a SQLite database, rows in PostgreSQL).

    Args:
        store: the Coordinator's store (its artifact_put / artifact_get, fenced there).
        config: `max_upload_bytes`, the largest file accepted.
    """

    METHODS = TRANSFER_METHODS

    def __init__(self, store: Any, config: Config) -> None:
        self._store = store
        self._max = config.max_upload_bytes
        self._locks: dict[str, _Turn] = {}

    def _ref(self, p: ArtifactPut | ArtifactGet) -> LeaseRef:
        if not _SHA.fullmatch(p.sha256):
            raise errors.BadRequest("sha256 must be 64 lowercase hex digits")
        return lease_ref(p)

    async def artifact_put(self, p: ArtifactPut) -> ArtifactPutResult:
        """Take one chunk; answer how many bytes coordd holds (and the path when done).
        Puts of one sha256 take turns here (the store's files or rows of one upload).

        Raises: BadRequest (bad sha256/size/offset, a file that does not hash as announced,
        a size other than the stored artifact's), PayloadTooLarge (over the cap),
        lease errors as for `checkpoint`.
        """
        if p.size < 0:
            raise errors.BadRequest(f"size must be >= 0 bytes, not {p.size}")
        if p.size > self._max:
            raise errors.PayloadTooLarge(f"artifact of {p.size} bytes: the cap is {self._max}")
        if len(p.data) > CHUNK_MAX_BYTES or p.offset < 0 or p.offset + len(p.data) > p.size:
            raise errors.BadRequest(f"chunk at {p.offset} of {len(p.data)} bytes does not fit a "
                                    f"{p.size}-byte file (chunks up to {CHUNK_MAX_BYTES} bytes)")
        ref = self._ref(p)
        turn = self._locks.setdefault(p.sha256, _Turn())
        turn.users += 1  # dropped with the last user, not when the lock is free: a woken
        try:             # waiter has not taken it yet
            async with turn.lock:
                return await self._store.artifact_put(  # type: ignore[no-any-return]
                    ref, p.sha256, p.size, p.offset, p.data)
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._locks[p.sha256]

    async def held(self, artifact: ArtifactRef) -> ArtifactRef:
        """The store's own reference to the artifact a result names (`complete`): what is
        recorded for the job, the store's size and path, never the worker's path.

        Raises: BadRequest (a malformed sha256; the store does not hold it with
        `artifact.size` bytes: the worker uploads it with `artifact_put` and resends).
        """
        if not _SHA.fullmatch(artifact.sha256):
            raise errors.BadRequest("artifact sha256 must be 64 lowercase hex digits")
        held = await self._store.artifact_held(artifact.sha256)
        if held is None or held.size != artifact.size:
            raise errors.BadRequest(not_held(artifact.sha256, artifact.size))
        return held  # type: ignore[no-any-return]

    async def artifact_get(self, p: ArtifactGet) -> ArtifactData:
        """Bytes of a stored file (none from its end on). Raises: NotFound, BadRequest
        (offset outside 0..the upload cap, limit outside 1..CHUNK_MAX_BYTES), lease errors."""
        if not 0 <= p.offset <= self._max or not 0 < p.limit <= CHUNK_MAX_BYTES:
            raise errors.BadRequest(f"need 0 <= offset <= {self._max} and "
                                    f"0 < limit <= {CHUNK_MAX_BYTES}")
        return await self._store.artifact_get(  # type: ignore[no-any-return]
            self._ref(p), p.sha256, p.offset, p.limit)
