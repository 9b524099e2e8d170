"""Bug 8 through a real coordd and coord-worker: a model that writes its checkpoints in place,
slowly, and SIGKILLs itself in the middle of one. The record must only ever name a whole
file, and the next attempt must be handed that whole file."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

from tests.integration.workerbench import bench  # noqa: F401  (the fixture)

# Attempt 1: ckpt-1 written in place in three slow chunks (never renamed), a pause, then
# ckpt-2 half written in place and the model SIGKILLs itself mid-write (an OOM kill, say).
# A resumed attempt reports what it was handed.
MODEL = textwrap.dedent("""
    import json, os, signal, sys, time
    d = os.environ["COORD_CHECKPOINT_DIR"]
    resume = os.environ["COORD_RESUME_FROM"]
    blob = lambda n: b"ckpt%d:" % n + b"x" * 30000 + b":end\\n"
    if resume:
        data = open(resume, "rb").read()
        with open(os.environ["COORD_RESULT"], "w") as fh:
            json.dump({"resumed": data.decode(), "name": os.path.basename(resume)}, fh)
        sys.exit(0)
    def in_place(name, data, parts=3, die=False):
        with open(os.path.join(d, name), "wb") as fh:
            step = len(data) // parts
            for i in range(parts):
                fh.write(data[i * step:(i + 1) * step] if i < parts - 1 else data[i * step:])
                fh.flush()
                if die and i == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.3)
    in_place("ckpt-1", blob(1))
    time.sleep(1.8)
    if os.environ.get("MARK"):  # stopped mid-write: SIGTERM -> exit 75 from inside the write
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
        open(os.environ["MARK"], "w").close()
        in_place("ckpt-2", blob(2), parts=30)
    in_place("ckpt-2", blob(2), die=True)
""")


def blob(n: int) -> bytes:
    return b"ckpt%d:" % n + b"x" * 30000 + b":end\n"


async def test_b8_in_place_slow_writer_killed_mid_write_resumes_from_the_whole_file(bench):  # noqa: F811
    """The model SIGKILLs itself half-way through ckpt-2."""
    model = bench.tmp / "inplace.py"
    model.write_text(MODEL)
    import sys
    kinds = {"inplace": {"argv": [sys.executable, str(model)]}}
    job = await bench.enqueue({}, kind="inplace", max_attempts=3)
    w = bench.start_worker(extra_kinds=kinds)
    final = await bench.status_is(job, "succeeded", "failed", timeout=30)
    assert final.status == "succeeded", (final.last_error, w.log())
    assert final.attempts == 2 and "SIGKILL" in (final.events[-3].reason or ""), final.events
    assert final.result == {"resumed": blob(1).decode(), "name": "ckpt-1"}
    ck = final.checkpoint  # the record never moved past the whole ckpt-1
    assert ck["name"] == "ckpt-1" and ck["sha256"] == hashlib.sha256(blob(1)).hexdigest()
    assert Path(ck["path"]).read_bytes() == blob(1) and ck["previous"] == []
    assert "checkpoint ckpt-2 recorded" not in w.log()


async def test_b8_model_exiting_75_from_sigterm_mid_write_leaves_the_record_whole(bench):  # noqa: F811
    """The worker is stopped (SIGTERM) while the model rewrites ckpt-2 in place; the model's
    handler exits 75 from inside the write: a retryable exit, but the file is half written."""
    import asyncio
    import signal
    import sys
    model, mark = bench.tmp / "inplace.py", bench.tmp / "writing"
    model.write_text(MODEL)
    kinds = {"inplace": {"argv": [sys.executable, str(model)], "env": {"MARK": str(mark)}}}
    job = await bench.enqueue({}, kind="inplace", max_attempts=3)
    a = bench.start_worker("A", extra_kinds=kinds, grace_s=3)
    await bench.until(lambda: asyncio.sleep(0, mark.exists()), what="ckpt-2 being written")
    await asyncio.sleep(0.5)
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(15) == 0, a.log()
    back = await bench.status_is(job, "waiting", timeout=10)
    assert "worker_shutdown" in (back.last_error or ""), back.last_error
    assert back.checkpoint["name"] == "ckpt-1", back.checkpoint
    assert Path(back.checkpoint["path"]).read_bytes() == blob(1)
    bench.start_worker("B", extra_kinds=kinds)
    final = await bench.status_is(job, "succeeded", "failed", timeout=20)
    assert final.result == {"resumed": blob(1).decode(), "name": "ckpt-1"}, final.last_error


GRACEFUL = textwrap.dedent("""
    import os, signal, sys, time
    d = os.environ["COORD_CHECKPOINT_DIR"]
    def last_checkpoint(*_):  # the contract: temp name, fsync, rename; then exit 75
        tmp = os.path.join(d, ".ckpt-final.tmp")
        with open(tmp, "wb") as fh:
            fh.write(b"final state")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, os.path.join(d, "ckpt-final"))
        time.sleep(1.6)  # still in the grace period
        sys.exit(75)
    signal.signal(signal.SIGTERM, last_checkpoint)
    open(os.environ["MARK"], "w").close()
    time.sleep(60)
""")


async def test_b8_a_last_checkpoint_renamed_in_during_the_grace_period_is_recorded(bench):  # noqa: F811
    import asyncio
    import signal
    import sys
    model, mark = bench.tmp / "graceful.py", bench.tmp / "started"
    model.write_text(GRACEFUL)
    kinds = {"graceful": {"argv": [sys.executable, str(model)], "env": {"MARK": str(mark)}}}
    job = await bench.enqueue({}, kind="graceful")
    w = bench.start_worker(extra_kinds=kinds, grace_s=4)
    await bench.until(lambda: asyncio.sleep(0, mark.exists()), what="the model started")
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(15) == 0, w.log()
    back = await bench.client.get_job(job)
    assert back.status == "waiting" and back.checkpoint["name"] == "ckpt-final", w.log()
    assert Path(back.checkpoint["path"]).read_bytes() == b"final state"
