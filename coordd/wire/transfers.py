"""Wire Structs of file transfers over the connection (issue 18): `artifact_put` and
`artifact_get`, fenced by the lease like `checkpoint`. Data only, no I/O.

Registered in coordd.wire.protocol's PARAMS. Same evolution rules: new fields get defaults and
go last; a field's type never changes.
"""

from __future__ import annotations

import msgspec


class ArtifactPut(msgspec.Struct, kw_only=True):
    """`artifact_put`: bytes `offset..offset+len(data)` of the file `sha256` (`size` bytes
    in all) for the job whose lease this is. coordd answers where it stands: resend from
    `received` (resumable); `done` once the whole file verified and is in the store."""

    job_id: str
    worker_id: str
    token: int
    sha256: str
    size: int
    offset: int = 0
    data: bytes = b""


class ArtifactPutResult(msgspec.Struct, kw_only=True):
    """`artifact_put` result: bytes coordd holds of the file, and its stored path once done."""

    received: int
    done: bool = False
    path: str = ""


class ArtifactGet(msgspec.Struct, kw_only=True):
    """`artifact_get`: up to `limit` bytes from `offset` of the stored file `sha256`."""

    job_id: str
    worker_id: str
    token: int
    sha256: str
    offset: int = 0
    limit: int = 1 << 20


class ArtifactData(msgspec.Struct, kw_only=True):
    """`artifact_get` result: the bytes, and the file's whole size."""

    data: bytes
    size: int


TRANSFER_PARAMS: dict[str, type[msgspec.Struct]] = {
    "artifact_put": ArtifactPut,
    "artifact_get": ArtifactGet,
}
"""The transfer methods and their params Structs (merged into protocol.PARAMS)."""
