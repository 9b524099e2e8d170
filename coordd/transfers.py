"""Files that travel over the connection (issue 18): a remote worker's large results and
checkpoints go into coordd's artifact store (`artifact_put`), and a remote worker resuming
a job reads its checkpoint back (`artifact_get`). Nothing depends on a shared filesystem.

Uploads are chunked, resumable and hashed: the bytes gather in `<store>/.uploads/<sha>.part`
(each call says where coordd stands; a worker that reconnects resends from there), and the
file enters the store (`<sha[:2]>/<sha>`, coordd.cas) only once its SHA-256 and size are
the ones announced. Both methods are fenced like `checkpoint` (job, worker, token, unexpired
lease), so only a lease holder can put bytes on coordd's disk. File I/O runs in a thread,
never in the writer's transaction.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from coordd import errors, leases
from coordd.clock import Clock
from coordd.config import Config
from coordd.protocol_transfers import ArtifactData, ArtifactGet, ArtifactPut, ArtifactPutResult
from coordd.store.sqlite_artifacts import put_chunk, read_range

TRANSFER_METHODS = ("artifact_put", "artifact_get")
CHUNK_MAX_BYTES = 4 << 20
_SHA = re.compile(r"[0-9a-f]{64}")


class Transfers:
    """`artifact_put` / `artifact_get` over the Coordinator's artifact store.

    Args:
        root: the artifact store (coordd.config.artifact_dir_for).
        read: runs `fn(conn, *args)` on a read connection (the lease check).
        clock: coordd's clock (lease expiry).
        config: `max_upload_bytes`, the largest file accepted.
    """

    METHODS = TRANSFER_METHODS

    def __init__(self, root: str, read: Any, clock: Clock, config: Config) -> None:
        self._root = root
        self._read = read
        self._clock = clock
        self._max = config.max_upload_bytes
        self._locks: dict[str, asyncio.Lock] = {}

    async def _fence(self, p: ArtifactPut | ArtifactGet) -> None:
        if not _SHA.fullmatch(p.sha256):
            raise errors.BadRequest("sha256 must be 64 lowercase hex digits")
        await self._read(leases._check_lease, self._clock.wall(), p.job_id, p.worker_id,
                         p.token)

    async def artifact_put(self, p: ArtifactPut) -> ArtifactPutResult:
        """Take one chunk; answer how many bytes coordd holds (and the path when done).

        Raises: BadRequest (bad sha256/size/offset, a file that does not hash as announced),
        PayloadTooLarge (over the cap), lease errors as for `checkpoint`.
        """
        if not 0 <= p.size <= self._max:
            raise errors.PayloadTooLarge(f"artifact of {p.size} bytes: the cap is {self._max}")
        if len(p.data) > CHUNK_MAX_BYTES or p.offset < 0 or p.offset + len(p.data) > p.size:
            raise errors.BadRequest(f"chunk at {p.offset} of {len(p.data)} bytes does not fit a "
                                    f"{p.size}-byte file (chunks up to {CHUNK_MAX_BYTES} bytes)")
        await self._fence(p)
        lock = self._locks.setdefault(p.sha256, asyncio.Lock())
        try:
            async with lock:
                return await asyncio.to_thread(self._put, p)
        finally:
            if not lock.locked() and self._locks.get(p.sha256) is lock:
                del self._locks[p.sha256]

    def _put(self, p: ArtifactPut) -> ArtifactPutResult:
        return put_chunk(self._root, p.sha256, p.size, p.offset, p.data)

    async def artifact_get(self, p: ArtifactGet) -> ArtifactData:
        """Bytes of a stored file. Raises: NotFound, BadRequest, lease errors."""
        if p.offset < 0 or not 0 < p.limit <= CHUNK_MAX_BYTES:
            raise errors.BadRequest(f"need offset >= 0 and 0 < limit <= {CHUNK_MAX_BYTES}")
        await self._fence(p)
        return await asyncio.to_thread(self._get, p)

    def _get(self, p: ArtifactGet) -> ArtifactData:
        return read_range(self._root, p.sha256, p.offset, p.limit)
