"""Files of a job: its folder, checkpoints and result; stored into the content-addressed
artifact store of coordd.cas.

Blocking file I/O: call these from a thread (`asyncio.to_thread`) in async code. A file is
copied to a temp name, fsynced, renamed into place and its folder fsynced *before* coordd is
told about it (DESIGN.md, "The single writer": nothing slow inside a transaction).
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

import msgspec

from coordd.cas import sha256_file, store_file

logger = logging.getLogger(__name__)



def copy_out(src: str, dest: str) -> None:
    """Copy a stored file to `dest` (the model gets its own copy, never the store's file)."""
    shutil.copyfile(src, dest)


# ---------------------------------------------------------------- a job's folder and result


def safe_name(job_id: str) -> str:
    name = job_id.replace(os.sep, "_")
    return name if name not in ("", ".", "..") else f"job-{name}"



def prepare_job_dir(job_dir: str, job_id: str, payload: Any, checkpoint: Any) -> dict[str, str]:
    """Make a fresh job folder with payload.json; return the placeholder values.

    payload.json is written plainly, not fsynced: the folder is new and only the model
    reads it, after this returns; after a crash the next attempt rebuilds the folder from
    coordd's copy of the payload. (An fsync here cost ~8 ms per spawn, issue 6.)"""
    if os.path.exists(job_dir):
        shutil.rmtree(job_dir)  # a previous attempt's leftovers must not look like new checkpoints
    ckpt_dir = os.path.join(job_dir, "checkpoints")
    os.makedirs(ckpt_dir)
    payload_path = os.path.join(job_dir, "payload.json")
    with open(payload_path, "wb") as fh:
        fh.write(msgspec.json.encode(payload))
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
