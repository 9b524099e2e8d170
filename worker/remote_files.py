"""The files of a worker that does not share coordd's store (issue 18: a remote one; issue
28: any worker of a PostgreSQL coordd, whose artifacts are in the database): it keeps its
own content-addressed store, uploads a large result or a checkpoint into coordd's
(`artifact_put`, chunked and resumable) before naming it in `complete` / `checkpoint`,
and downloads a job's checkpoint files (`artifact_get`, verified by SHA-256) before
resuming. Records sent to coordd always name
coordd's paths, so any worker (local or remote) and a backup can use them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from typing import Any

from coordd import cas
from coordd.client import Client
from coordd.wire.transfers import ArtifactData, ArtifactPutResult

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
CALL_TIMEOUT_S = 30.0


def is_remote(client: Any) -> bool:
    """coordd is on another host (tls:// or tcp://): files travel over the connection."""
    connector = getattr(client, "connector", None)
    return connector is not None and connector.scheme != "unix"


def shares_store(client: Any, coordd_store: str | None) -> bool:
    """This worker writes straight into coordd's store: coordd is on this host and named a
    folder (its heartbeat's `artifact_dir`; a SQLite coordd does, a PostgreSQL one keeps
    its artifacts in the database and names none). Otherwise files travel over the
    connection (`artifact_put` / `artifact_get`)."""
    return coordd_store is not None and not is_remote(client)


def store_dir(client: Any, coordd_store: str | None, work_dir: str) -> str:
    """Where this worker stores files: coordd's store where it shares it (shares_store),
    else this host's own beside `work_dir`."""
    local = os.path.join(os.path.dirname(work_dir), "artifacts")
    if coordd_store is not None and shares_store(client, coordd_store):
        return coordd_store
    return local


def for_job(client: Any, coordd_store: str | None, store: str, run: Any,
            worker_id: str) -> "RemoteFiles | None":
    """The transfers of `run` (a JobRun) into coordd's store, or None where this worker
    shares that store (shares_store). `store`: this worker's own (store_dir)."""
    return None if shares_store(client, coordd_store) else \
        RemoteFiles(client, store, run.job_id, worker_id, run.token)


async def upload_result(files: "RemoteFiles | None", artifact: dict[str, Any] | None) -> str | None:
    """Put a result artifact into coordd's store and point it there (in place); the reason
    it could not be, or None (done, or nothing to do: local coordd, an inline result)."""
    if files is None or artifact is None:
        return None
    try:
        artifact["path"] = await files.upload(**artifact)
    except Exception as exc:  # CoordError, OSError: the attempt fails retryably
        return f"cannot upload the result: {exc}"
    return None


class RemoteFiles:
    """Transfers for one job's lease (job_id, worker_id, token) through `client`.

    Args:
        client: the worker's coordd Client.
        local_store: this host's store (worker.artifacts writes into it).
    """

    def __init__(self, client: Client, local_store: str, job_id: str, worker_id: str,
                 token: int) -> None:
        self._client = client
        self.local_store = local_store
        self._lease = {"job_id": job_id, "worker_id": worker_id, "token": token}
        self.remote_path: dict[str, str] = {}  # sha256 -> coordd's path

    async def upload(self, path: str, sha256: str, size: int) -> str:
        """Send the local file `path` (its `sha256`, `size`) unless coordd has it; return
        coordd's path. Resumes where coordd's partial copy ends. Raises: CoordError."""
        if sha256 in self.remote_path:
            return self.remote_path[sha256]
        offset = 0
        with open(path, "rb") as fh:
            while True:
                fh.seek(offset)
                data = await asyncio.to_thread(fh.read, CHUNK_BYTES)
                r = await self._client.call("artifact_put", {
                    **self._lease, "sha256": sha256, "size": size, "offset": offset,
                    "data": data}, ArtifactPutResult, timeout=CALL_TIMEOUT_S)
                if r.done:
                    self.remote_path[sha256] = r.path
                    return r.path
                offset = r.received  # where coordd stands (a resend after a reconnect)

    async def remote_record(self, record: dict[str, Any]) -> None:
        """Upload `record`'s file and point it (and its `previous` entries) at coordd's
        paths, in place. Raises: CoordError, OSError."""
        record["path"] = await self.upload(record["path"], record["sha256"], record["size"])
        for prev in record.get("previous") or []:
            if isinstance(prev, dict) and prev.get("sha256") in self.remote_path:
                prev["path"] = self.remote_path[prev["sha256"]]

    async def download(self, sha256: str, size: int) -> str | None:
        """Fetch coordd's file into the local store; its local path, or None (logged) if it
        cannot be had or does not verify."""
        dest = os.path.join(self.local_store, sha256[:2], sha256)
        if os.path.exists(dest):
            return dest
        await asyncio.to_thread(cas.make_dir, os.path.dirname(dest))
        part = dest + ".part"
        h, got = hashlib.sha256(), 0
        try:
            with open(part, "wb") as out:
                while got < size:
                    r = await self._client.call("artifact_get", {
                        **self._lease, "sha256": sha256, "offset": got,
                        "limit": CHUNK_BYTES}, ArtifactData, timeout=CALL_TIMEOUT_S)
                    if not r.data:
                        break
                    await asyncio.to_thread(out.write, r.data)
                    h.update(r.data)
                    got += len(r.data)
                out.flush()
                os.fsync(out.fileno())
            if (h.hexdigest(), got) != (sha256, size):
                raise ValueError(f"got {h.hexdigest()[:12]}/{got} bytes")
            os.rename(part, dest)
        except Exception as exc:  # CoordError, OSError, a mismatch: resume tries an older one
            logger.warning("checkpoint %s not fetched from coordd: %s", sha256[:12], exc,
                           extra={"action": "checkpoint_fetch_failed", "sha256": sha256})
            try:
                os.unlink(part)
            except OSError:
                pass
            return None
        return dest

    async def localize(self, checkpoint: Any) -> Any:
        """A copy of a checkpoint record whose files are fetched here, newest first until
        one is; their paths point into the local store (the originals are remembered for
        the next records)."""
        from worker.checkpoints import refs_of
        if not isinstance(checkpoint, dict):
            return checkpoint
        out = {**checkpoint, "previous": [dict(p) if isinstance(p, dict) else p
                                          for p in checkpoint.get("previous") or []]}
        entries = [out, *[p for p in out["previous"] if isinstance(p, dict)]]
        by_sha = {r["sha256"]: r for r in refs_of(checkpoint)}
        for entry in entries:
            ref = by_sha.get(entry.get("sha256"))
            if ref is None:
                continue
            self.remote_path[ref["sha256"]] = ref["path"]
            local = await self.download(ref["sha256"], ref["size"])
            if local is not None:
                entry["path"] = local
                break
        return out
