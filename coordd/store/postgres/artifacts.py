"""Artifacts on PostgreSQL (coordd.store.api_artifacts.ArtifactStore): the bytes in the
database, so every coordd of a deployment serves what any of them stored.

An upload's chunks are rows of `artifact_chunks` (sha256, pos, data) as they arrive, its
progress a row of `artifact_uploads`; once all bytes are held and hash as announced, an
`artifacts` row (path `postgresql:<sha256>`) makes the same chunks the stored artifact, no
copy. Every put of one sha256 runs under a transaction advisory lock on it (two workers
uploading the same content take turns), after the fence holds the lease row (FOR KEY
SHARE) as coordd.store.postgres.logs does. Hashing streams the chunks through a cursor.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from coordd import errors
from coordd.wire.protocol import ArtifactRef
from coordd.wire.transfers import ArtifactData, ArtifactPutResult
from coordd.store.api import LeaseRef
from coordd.store.api_artifacts import stored_with_other_size
from coordd.store.postgres import fence
from coordd.store.postgres.sql import NOW

PATH_PREFIX = "postgresql:"
HASH_PREFETCH = 4  # chunks (up to 4 MiB each) a hashing cursor fetches at once

SQL_ARTIFACT_FENCE = (  # $2 job, $3 worker, $4 token: the statement's NOW if fenced
    f"SELECT {NOW} FROM leases l WHERE l.job_id = $2 AND l.worker_id = $3 "
    f"AND l.token = $4 AND l.expires_at > {NOW} FOR KEY SHARE OF l"
)
SQL_ARTIFACT_LOCK = "SELECT pg_advisory_xact_lock(hashtext('coordd-artifacts'), hashtext($1))"
SQL_ARTIFACT_STORED = "SELECT size, path FROM artifacts WHERE sha256 = $1"
SQL_ARTIFACT_TOUCH = "UPDATE artifacts SET created_at = $2 WHERE sha256 = $1"
SQL_UPLOAD = "SELECT received FROM artifact_uploads WHERE sha256 = $1"
SQL_UPLOAD_SET = (  # $1 sha, $2 size, $3 received, $4 now
    "INSERT INTO artifact_uploads (sha256, size, received, updated_at) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (sha256) DO UPDATE SET size = $2, received = $3, updated_at = $4"
)
SQL_UPLOAD_DROP = "DELETE FROM artifact_uploads WHERE sha256 = $1"
SQL_CHUNKS_DROP = "DELETE FROM artifact_chunks WHERE sha256 = $1"
SQL_CHUNK_PUT = (
    "INSERT INTO artifact_chunks (sha256, pos, data) VALUES ($1, $2, $3) "
    "ON CONFLICT (sha256, pos) DO UPDATE SET data = excluded.data"
)
SQL_CHUNKS = "SELECT data FROM artifact_chunks WHERE sha256 = $1 ORDER BY pos"
SQL_ARTIFACT_INSERT = (  # $1 sha, $2 path, $3 size, $4 now
    "INSERT INTO artifacts (sha256, path, size, created_at) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (sha256) DO UPDATE SET created_at = $4"
)
SQL_RANGE = (  # $1 sha, $2 offset, $3 limit: the chunks overlapping the range, in order
    "SELECT pos, data FROM artifact_chunks WHERE sha256 = $1 AND pos < $2::bigint + $3::bigint "
    "AND pos + octet_length(data) > $2::bigint ORDER BY pos"
)
SQL_RESULT_REFS = (
    "SELECT DISTINCT a.sha256, a.path FROM jobs j JOIN artifacts a "
    "ON a.sha256 = j.artifact_sha256"
)
SQL_CHECKPOINTS = (  # records that may name a file (checkpoint_json is text, as on SQLite)
    "SELECT checkpoint_json FROM jobs WHERE checkpoint_json LIKE '%\"sha256\"%'"
)
SQL_SWEEP_CANDIDATES = (  # $1 before
    "SELECT sha256 FROM artifacts a WHERE created_at < $1 "
    "AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.artifact_sha256 = a.sha256)"
)
SQL_SWEEP = (  # $1 before, $2 candidates less the checkpoints' refs: deleted, with chunks
    "WITH gone AS (DELETE FROM artifacts a WHERE sha256 = ANY($2::text[]) "
    "AND created_at < $1 AND NOT EXISTS (SELECT 1 FROM jobs j "
    "WHERE j.artifact_sha256 = a.sha256) RETURNING sha256), "
    "c AS (DELETE FROM artifact_chunks c USING gone WHERE c.sha256 = gone.sha256) "
    "SELECT count(*) FROM gone"
)
SQL_SWEEP_UPLOADS = (  # $1 before: uploads left unfinished, with their chunks
    "WITH gone AS (DELETE FROM artifact_uploads u WHERE updated_at < $1 "
    "AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.sha256 = u.sha256) "
    "RETURNING sha256) DELETE FROM artifact_chunks c USING gone WHERE c.sha256 = gone.sha256"
)
SQL_BYTES = (
    "SELECT (SELECT coalesce(sum(size), 0) FROM artifacts) "
    "+ (SELECT coalesce(sum(received), 0) FROM artifact_uploads)"
)

_Record = msgspec.json.Decoder()


def checkpoint_refs(checkpoint_json: str) -> list[tuple[str, str]]:
    """(sha256, path) of the file a checkpoint record names and of its `previous` ones,
    as coordd.store.views.artifact_refs reads them on SQLite (text sha256 and path only)."""
    try:
        rec = _Record.decode(checkpoint_json)
    except msgspec.DecodeError:
        return []
    if not isinstance(rec, dict):
        return []
    prev = rec.get("previous")
    found = [rec] + (prev if isinstance(prev, list) else [])
    return [(r["sha256"], r["path"]) for r in found if isinstance(r, dict)
            and isinstance(r.get("sha256"), str) and isinstance(r.get("path"), str)]


class ArtifactOps:
    """ArtifactStore over PostgresStore's pool (`self._conn()`); see the module docstring."""

    _conn: Any
    artifact_dir: str | None = None  # no folder: workers send files over the connection

    async def artifact_put(self, ref: LeaseRef, sha256: str, size: int, offset: int,
                           data: bytes, *, now: float | None = None) -> ArtifactPutResult:
        """Fence, then take the chunk, in one transaction; hash and store the artifact
        when it is whole. Raises: the fencing errors; errors.BadRequest (the bytes do not
        hash as announced; or the sha256 is stored already with another size)."""
        async with self._conn() as conn:
            async with conn.transaction():
                res, refused = await self._put(conn, ref, sha256, size, offset, data, now)
            if refused is not None:  # what was gathered is dropped (committed), then refused
                raise errors.BadRequest(refused)
            return res

    async def _put(self, conn: Any, ref: LeaseRef, sha256: str, size: int, offset: int,
                   data: bytes, now: float | None) -> tuple[ArtifactPutResult, str | None]:
        t = await conn.fetchval(SQL_ARTIFACT_FENCE, now, ref.job_id, ref.worker_id, ref.token)
        if t is None:
            raise await fence.refusal(conn, now, ref)
        await conn.execute(SQL_ARTIFACT_LOCK, sha256)
        stored = await conn.fetchrow(SQL_ARTIFACT_STORED, sha256)
        if stored is not None:
            if stored[0] != size:
                return ArtifactPutResult(received=0), \
                    stored_with_other_size(sha256, stored[0], size)
            await conn.execute(SQL_ARTIFACT_TOUCH, sha256, t)
            return ArtifactPutResult(received=size, done=True, path=stored[1]), None
        have = await conn.fetchval(SQL_UPLOAD, sha256) or 0
        if have > size:  # a stale part of another size: start over
            await conn.execute(SQL_CHUNKS_DROP, sha256)
            have = 0
        if offset != have:
            return ArtifactPutResult(received=have), None
        if data:
            await conn.execute(SQL_CHUNK_PUT, sha256, offset, data)
        have += len(data)
        if have < size:
            await conn.execute(SQL_UPLOAD_SET, sha256, size, have, t)
            return ArtifactPutResult(received=have), None
        h, got = hashlib.sha256(), 0
        async for (chunk,) in conn.cursor(SQL_CHUNKS, sha256, prefetch=HASH_PREFETCH):
            h.update(chunk)
            got += len(chunk)
        await conn.execute(SQL_UPLOAD_DROP, sha256)
        if (h.hexdigest(), got) != (sha256, size):
            await conn.execute(SQL_CHUNKS_DROP, sha256)
            return ArtifactPutResult(received=0), (
                f"the uploaded file hashes to {h.hexdigest()[:12]}/{got} bytes, not the "
                f"announced {sha256[:12]}/{size}; send it again")
        path = PATH_PREFIX + sha256
        await conn.execute(SQL_ARTIFACT_INSERT, sha256, path, size, t)
        return ArtifactPutResult(received=size, done=True, path=path), None

    async def artifact_get(self, ref: LeaseRef, sha256: str, offset: int, limit: int, *,
                           now: float | None = None) -> ArtifactData:
        """Fence, then the chunks overlapping the range, cut to it.
        Raises: the fencing errors, errors.NotFound."""
        async with self._conn() as conn, conn.transaction():
            if await conn.fetchval(SQL_ARTIFACT_FENCE, now, ref.job_id, ref.worker_id,
                                   ref.token) is None:
                raise await fence.refusal(conn, now, ref)
            stored = await conn.fetchrow(SQL_ARTIFACT_STORED, sha256)
            if stored is None:
                raise errors.NotFound(f"artifact {sha256[:12]} is not in coordd's store")
            rows = await conn.fetch(SQL_RANGE, sha256, offset, limit)
        out = b"".join(bytes(data)[max(offset - pos, 0):offset + limit - pos]
                       for pos, data in rows)
        return ArtifactData(data=out, size=stored[0])

    async def artifact_held(self, sha256: str) -> ArtifactRef | None:
        async with self._conn() as conn:
            stored = await conn.fetchrow(SQL_ARTIFACT_STORED, sha256)
        return None if stored is None else \
            ArtifactRef(sha256=sha256, size=stored[0], path=stored[1])

    async def artifact_refs(self) -> dict[str, str]:
        """Results' artifacts, then the checkpoint records' files (decoded here)."""
        async with self._conn() as conn:
            refs = {sha: path for sha, path in await conn.fetch(SQL_RESULT_REFS)}
            records = [r[0] for r in await conn.fetch(SQL_CHECKPOINTS)]
        for rec in records:
            for sha, path in checkpoint_refs(rec):
                refs.setdefault(sha, path)
        return refs

    async def artifact_sweep(self, before: float, *, now: float | None = None) -> int:
        """Delete unreferenced artifacts last put before `before`, and uploads left
        unfinished since, with their chunks. A candidate is checked again in the
        deleting statement (a put in between makes it fresh)."""
        async with self._conn() as conn:
            cands = {r[0] for r in await conn.fetch(SQL_SWEEP_CANDIDATES, before)}
            if cands:
                records = [r[0] for r in await conn.fetch(SQL_CHECKPOINTS)]
                cands -= {sha for rec in records for sha, _ in checkpoint_refs(rec)}
            async with conn.transaction():
                gone = await conn.fetchval(SQL_SWEEP, before, sorted(cands)) if cands else 0
                await conn.execute(SQL_SWEEP_UPLOADS, before)
        return gone

    async def artifact_bytes(self) -> int:
        """Stored artifacts' sizes plus uploads' received bytes."""
        async with self._conn() as conn:
            return int(await conn.fetchval(SQL_BYTES))
