"""Files of a job: its folder, checkpoints and result, and the content-addressed artifact store
(`<root>/<sha[:2]>/<sha256>`, written crash-safely).

Blocking file I/O: call these from a thread (`asyncio.to_thread`) in async code. A file is
copied to a temp name, fsynced, renamed into place and its folder fsynced *before* coordd is
told about it (DESIGN.md, "The single writer": nothing slow inside a transaction).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import msgspec

logger = logging.getLogger(__name__)

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
    hash of the bytes actually copied. An existing file of the same hash is kept.

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


def copy_out(src: str, dest: str) -> None:
    """Copy a stored file to `dest` (the model gets its own copy, never the store's file)."""
    shutil.copyfile(src, dest)


# ---------------------------------------------------------------- a job's folder and result


def safe_name(job_id: str) -> str:
    name = job_id.replace(os.sep, "_")
    return name if name not in ("", ".", "..") else f"job-{name}"



def prepare_job_dir(job_dir: str, job_id: str, payload: Any, checkpoint: Any) -> dict[str, str]:
    """Make a fresh job folder with payload.json (fsynced); return the placeholder values."""
    if os.path.exists(job_dir):
        shutil.rmtree(job_dir)  # a previous attempt's leftovers must not look like new checkpoints
    ckpt_dir = os.path.join(job_dir, "checkpoints")
    os.makedirs(ckpt_dir)
    payload_path = os.path.join(job_dir, "payload.json")
    write_atomic(payload_path, msgspec.json.encode(payload))
    return {"job_id": job_id, "payload": payload_path,
            "result": os.path.join(job_dir, "result.json"), "checkpoint_dir": ckpt_dir,
            "resume_from": resume_copy(job_dir, checkpoint)}


def resume_copy(job_dir: str, checkpoint: Any) -> str:
    """Copy the recorded checkpoint into the job folder; "" if there is none or it is unusable."""
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("path"), str):
        return ""
    src = checkpoint["path"]
    name = os.path.basename(str(checkpoint.get("name") or src)) or "checkpoint"
    dest = os.path.join(job_dir, "resume", name)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    try:
        copy_out(src, dest)
        sha, _size = sha256_file(dest)
    except OSError as exc:
        logger.warning("checkpoint %s unreadable, starting fresh: %s", src, exc,
                       extra={"action": "resume_missing"})
        return ""
    if checkpoint.get("sha256") not in (None, sha):
        logger.warning("checkpoint %s has the wrong sha256, starting fresh", src,
                       extra={"action": "resume_corrupt"})
        return ""
    return dest


def newest_new_file(directory: str, seen: set[str]) -> str | None:
    """Return the newest complete file in `directory` not in `seen` (older new ones join `seen`).

    Temp names (a leading dot, `.tmp`/`.partial`) are skipped: models rename into place.
    """
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                name = entry.name
                if name in seen or name.startswith(".") or name.endswith((".tmp", ".partial")):
                    continue
                try:
                    if entry.is_file(follow_symlinks=False):
                        found.append((entry.stat().st_mtime_ns, name))
                except FileNotFoundError:
                    continue
    except FileNotFoundError:
        return None
    if not found:
        return None
    found.sort()
    seen.update(name for _, name in found[:-1])
    return found[-1][1]


def read_result(path: str, store: str, *, max_bytes: int, as_json: bool, inline_bytes: int
                ) -> str | tuple[Any, dict[str, Any] | None]:
    """Validate the result file: (result, artifact) for complete, or the reason it is invalid."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return "exit 0 but no result file was written"
    if size > max_bytes:
        return f"result is {size} bytes, over max_result_bytes {max_bytes}"
    if as_json:
        with open(path, "rb") as fh:
            data = fh.read()
        try:
            value = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            return f"result is not valid JSON: {exc}"
        if len(data) <= inline_bytes:
            return value, None
    stored = store_file(store, path)
    return ({"artifact": stored.sha256, "bytes": stored.size},
            {"sha256": stored.sha256, "size": stored.size, "path": stored.path})
