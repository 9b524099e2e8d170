"""The store interface's artifacts (coordd.store.api's `Store`, this area apart): files a
job hands over (a result over the inline limit, a checkpoint), content-addressed by
SHA-256, uploaded in resumable chunks and read back in ranges.

Callers: coordd.service.transfers.Transfers.artifact_put / artifact_get (the RPC
methods of the same names; the checks of sha256 format, chunk size, offsets and the
`max_upload_bytes` cap stay there, made before a store is called) and
coordd.service.maintenance.Maintenance.prune (`artifact_sweep`, then `artifact_bytes` for the
`artifacts` figure of `status` and `metrics`); coordd.store.sqlite.backup (`artifact_refs`).

Where the bytes live: SQLite keeps files beside the database
(`<db folder>/artifacts/<sha[:2]>/<sha256>`, coordd.cas; the `path` is that file's);
PostgreSQL keeps them in the database (tables `artifact_chunks` and `artifacts`), so
every coordd of a deployment, active or standby on another host, serves them; its `path`
is `postgresql:<sha256>`, an address, not a file. Every call takes `now` (None in
production: the store's clock).
"""

from __future__ import annotations

from typing import Protocol

from coordd.wire.protocol import ArtifactRef
from coordd.wire.transfers import ArtifactData, ArtifactPutResult
from coordd.store.api import LeaseRef


class ArtifactStore(Protocol):
    """The artifact operations over one database (see the module docstring).

    Raises (both stores, the same situations):
        errors.NotFound: no such job (the fence) or no such stored artifact (a get).
        errors.LeaseLost, LeaseExpired, AlreadyCompleted: the fence, as for `checkpoint`.
        errors.BadRequest: a finished upload whose bytes do not hash to `sha256`/`size`
            (what was gathered is dropped: the next put starts from 0); a put announcing
            another size than the stored artifact's (`stored_with_other_size`: nothing
            is stored, the stored artifact stays).

    `artifact_dir`: the folder a worker on coordd's host may write into directly (SQLite:
    the store beside the database; named in the heartbeat's reply), or None (PostgreSQL:
    every worker sends its files with `artifact_put`).
    """

    artifact_dir: str | None

    async def artifact_put(self, ref: LeaseRef, sha256: str, size: int, offset: int,
                           data: bytes, *, now: float | None = None) -> ArtifactPutResult:
        """Take bytes `offset..offset+len(data)` of the file `sha256` (`size` bytes in all)
        for the job holding `ref` (fenced). Answers how many bytes the store holds
        (`received`: resend from there; a chunk at another offset stores nothing); once
        all `size` bytes are held and hash as announced the artifact is stored (`done`,
        its `path`). An artifact stored already answers `done` at once and is made fresh
        (its time is `now`: `artifact_sweep` keeps it). A part gathered for another,
        smaller size is started over."""
        ...

    async def artifact_get(self, ref: LeaseRef, sha256: str, offset: int, limit: int, *,
                           now: float | None = None) -> ArtifactData:
        """Up to `limit` bytes from `offset` of the stored artifact (fewer at its end,
        none past it) and its whole `size`, for the job holding `ref` (fenced).
        Raises: errors.NotFound (not stored, or still uploading)."""
        ...

    async def artifact_held(self, sha256: str) -> ArtifactRef | None:
        """The store's own reference to the stored artifact `sha256` (its size, and its
        path: SQLite's file, PostgreSQL's `postgresql:<sha256>`), or None where it holds
        none (never stored, swept, or still uploading). `sha256` is 64 lowercase hex
        digits (the caller checks it: on SQLite it names a file)."""
        ...

    async def artifact_refs(self) -> dict[str, str]:
        """sha256 -> path of every artifact a job refers to: a succeeded job's result
        artifact and its checkpoint record's file (and the record's `previous` ones)."""
        ...

    async def artifact_sweep(self, before: float, *, now: float | None = None) -> int:
        """Delete the stored artifacts no job refers to (`artifact_refs`) whose last put
        was before `before` (Unix seconds); return how many. A file stored but not yet
        recorded (a checkpoint on its way) is fresh, and kept (coordd.service.maintenance's
        ARTIFACT_GRACE_S is the caller's rule)."""
        ...

    async def artifact_bytes(self) -> int:
        """Bytes the stored artifacts (and uploads in progress) take, in bytes."""
        ...


def stored_with_other_size(sha256: str, stored: int, size: int) -> str:
    """`artifact_put`'s refusal, the same text on both stores: `sha256` is stored with
    `stored` bytes and a put announced `size`."""
    return f"artifact {sha256[:12]} is stored with {stored} bytes, not {size}"


def not_held(sha256: str, size: int) -> str:
    """`complete`'s refusal of a result artifact the store does not hold with `size`
    bytes (coordd.service.transfers decides; PostgreSQL's complete says the same where
    the artifact went between that check and its transaction)."""
    return (f"complete: artifact {sha256[:12]} ({size} bytes) is not in coordd's store; "
            f"upload it first (artifact_put)")


__all__ = ["ArtifactStore", "not_held", "stored_with_other_size"]
