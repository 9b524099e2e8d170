"""Files of a job: its folder, checkpoints and result; stored into the content-addressed
artifact store of coordd.cas.

Blocking file I/O: call these from a thread (`asyncio.to_thread`) in async code. A file is
copied to a temp name, fsynced, renamed into place and its folder fsynced *before* coordd is
told about it (docs/internals/design.md: nothing slow inside a transaction).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from typing import Any

import msgspec

from coordd.cas import store_file

logger = logging.getLogger(__name__)



# ---------------------------------------------------------------- a job's folder and result


def safe_name(job_id: str) -> str:
    name = job_id.replace(os.sep, "_")
    return name if name not in ("", ".", "..") else f"job-{name}"



def prepare_job_dir(job_dir: str, job_id: str, payload: Any) -> dict[str, str]:
    """Make a fresh job folder with payload.json; return the placeholder values
    (`resume_from` empty: worker.checkpoints fills it).

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
            "resume_from": "", "usage": os.path.join(job_dir, "usage.json")}


USAGE_MAX_BYTES = 4096


def read_usage(path: str) -> tuple[dict[str, float] | None, str | None]:
    """The usage the model reported in `path` (a JSON object of finite numbers >= 0):
    (usage, None), (None, None) when it wrote none, or (None, why it is ignored)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(USAGE_MAX_BYTES + 1)
    except FileNotFoundError:
        return None, None
    if len(data) > USAGE_MAX_BYTES:
        return None, f"usage file over {USAGE_MAX_BYTES} bytes"
    try:
        value = msgspec.json.decode(data, type=dict[str, float])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, f"usage is not a JSON object of numbers: {exc}"
    if not all(math.isfinite(v) and v >= 0 for v in value.values()):
        return None, "usage numbers must be finite and >= 0"
    return value or None, None


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
