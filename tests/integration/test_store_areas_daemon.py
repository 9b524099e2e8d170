"""Artifacts, maintenance and schedules through a real coordd over either store (issues
27, 28): a result over the worker's inline limit and a checkpoint go through a real
coord-worker into the store (on PostgreSQL into the database, over the connection), a
resumed attempt gets its checkpoint back; `prune`, `check`, `status` figures, a
schedule's slot fired by the reaper's round, and a node no worker can run skipped
(`worker_absent`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from coordd import errors
from coordd.client import Client
from tests.conftest import COOL
from tests.integration.workerbench import DAEMON_FAST, bench_over

BIG = 70_000  # bytes of result: over the worker's 64 KiB inline_result_bytes

# Attempt 1 stores a checkpoint (temp name, rename) and exits 75 once the test saw it
# recorded (the test makes the file MARK; a file is taken only once it held still for
# worker.checkpoints.SETTLE_S while the model ran, so a fixed wait races the scans);
# attempt 2 reports the file it was handed and a result over the inline limit.
MODEL = textwrap.dedent("""
    import json, os, sys, time
    d, resume = os.environ["COORD_CHECKPOINT_DIR"], os.environ["COORD_RESUME_FROM"]
    if not resume:
        with open(os.path.join(d, ".tmp"), "wb") as fh:
            fh.write(b"state:" + b"s" * 40000)
        os.replace(os.path.join(d, ".tmp"), os.path.join(d, "ckpt-1"))
        end = time.monotonic() + 30
        while not os.path.exists(os.environ["MARK"]) and time.monotonic() < end:
            time.sleep(0.05)
        sys.exit(75)
    with open(os.environ["COORD_RESULT"], "w") as fh:
        json.dump({"resumed": open(resume, "rb").read()[:6].decode(),
                   "pad": "x" * int(os.environ["BIG"])}, fh)
""")


@pytest.fixture
def fast_daemon(store_daemon_factory: Any) -> Any:
    """A started coordd with quick reaper rounds and no retention, over each store in turn
    (tests/integration/conftest.py's `store_daemon_factory`)."""
    d = store_daemon_factory(DAEMON_FAST + "retention_s = 0\nworkflow_absent_wait_s = 1\n",
                             name=store_daemon_factory.store)
    d.start()
    return d


@pytest.fixture
async def store_bench(fast_daemon: Any, tmp_path: Any) -> Any:
    """A Bench (tests.integration.test_worker) over `fast_daemon`."""
    async with bench_over(fast_daemon, tmp_path) as b:
        yield b


async def test_big_result_and_checkpoint_through_a_real_worker(store_bench):
    b = store_bench
    model = b.tmp / "ckpt.py"
    model.write_text(MODEL)
    mark = b.tmp / "MARK"
    kinds = {"ck": {"argv": [sys.executable, str(model)],
                    "env": {"MARK": str(mark), "BIG": str(BIG)}}}
    job = await b.enqueue({}, kind="ck", max_attempts=3)
    w = b.start_worker(extra_kinds=kinds)

    async def recorded() -> Any:
        return (await b.client.get_job(job)).checkpoint
    await b.until(recorded, what="attempt 1's checkpoint recorded")
    mark.touch()
    final = await b.status_is(job, "succeeded", "failed", timeout=30)
    assert final.status == "succeeded", (final.last_error, w.log())
    assert final.attempts == 2
    ck = final.checkpoint
    state = b"state:" + b"s" * 40000
    assert ck["name"] == "ckpt-1" and ck["sha256"] == hashlib.sha256(state).hexdigest()
    art = final.artifact
    assert art is not None and final.result == {"artifact": art.sha256, "bytes": art.size}
    assert art.size > 64 << 10
    if b.daemon.store is None:  # a local worker writes into coordd's folder
        assert Path(ck["path"]).read_bytes() == state
        assert json.loads(Path(art.path).read_bytes())["resumed"] == "state:"
    else:  # in the database, where every coordd of the deployment reads it
        assert ck["path"] == "postgresql:" + ck["sha256"]
        assert art.path == "postgresql:" + art.sha256
    assert "Traceback" not in b.daemon.log()


async def test_prune_check_and_status_figures(store_bench):
    b = store_bench
    c = b.client
    await c.heartbeat("wp", ["cpu"], COOL)
    done = await b.enqueue({})
    got = await c.claim("wp", lease_s=30)
    await c.complete(done, "wp", got.lease.token, {"ok": True})
    st = await c.status()
    assert st.db_bytes > 0 and st.prunable == 1
    checked = await c.call("check", {})
    assert checked == {"quick_check": "ok", "foreign_key_violations": 0, "invariants": []}
    pruned = await c.call("prune", {})
    assert pruned["pruned"] == 1 and pruned["db_bytes"] > 0
    with pytest.raises(errors.NotFound):
        await c.get_job(done)
    metrics = (await c.call("metrics", {}))["text"]
    assert 'coordd_storage_bytes{file="artifacts"}' in metrics
    if b.daemon.store is not None:
        with pytest.raises(errors.InvalidState, match="pg_dump"):
            await c.call("backup", {"dest": str(b.tmp / "copy.db")})


async def _due_now(daemon: Any, name: str) -> None:
    """Move schedule `name`'s next slot into the past (as a long downtime would)."""
    past = time.time() - 30
    if daemon.store is None:
        with closing(sqlite3.connect(daemon.db)) as conn, conn:
            conn.execute("UPDATE schedules SET next_at = ? WHERE name = ?", (past, name))
        return
    import asyncpg
    conn = await asyncpg.connect(daemon.store)
    try:
        await conn.execute("UPDATE schedules SET next_at = $1 WHERE name = $2", past, name)
    finally:
        await conn.close()


async def test_a_schedule_fires_its_slot_once(store_bench):
    b = store_bench
    c = b.client
    spec = {"name": "nightly", "nodes": [{"name": "a", "kind": "m", "required_role": "cpu"}]}
    added = await c.call("schedule_add", {"name": "n1", "cron": "0 3 * * *", "workflow": spec})
    assert added["created"] and added["fired"] == 0
    await _due_now(b.daemon, "n1")

    async def fired() -> Any:
        views = (await c.call("schedule_list", {}))["schedules"]
        return views[0] if views[0]["fired"] else None
    view = await b.until(fired, timeout=10, what="the slot fired")
    assert view["fired"] == 1 and view["next_at"] > time.time()
    await asyncio.sleep(1.0)  # more reaper rounds: the slot is not started again
    runs = (await c.call("workflow_list", {}))["workflows"]
    assert [w["schedule_id"] for w in runs] == [view["schedule_id"]]
    assert (await c.call("schedule_remove", {"name": "n1"})) == {}
    assert (await c.call("schedule_list", {}))["schedules"] == []


async def test_a_node_no_worker_can_run_is_skipped(store_bench):
    c = store_bench.client
    await c.heartbeat("wc", ["cpu"], COOL)
    spec = {"name": "needs-gpu", "nodes": [
        {"name": "train", "kind": "m", "required_role": "gpu"},
        {"name": "report", "kind": "m", "required_role": "cpu", "needs": ["train"]}]}
    wid = (await c.call("workflow_submit", spec))["workflow_id"]

    async def ended() -> Any:
        view = await c.call("workflow_get", {"workflow_id": wid})
        return view if view["status"] != "running" else None
    view = await store_bench.until(ended, timeout=10, what="the workflow ended")
    nodes = {n["name"]: n for n in view["nodes"]}
    assert nodes["train"]["status"] == "skipped"
    assert nodes["train"]["reason"].startswith("worker_absent: no live worker with role gpu")
    assert nodes["report"]["status"] == "skipped" and nodes["report"]["reason"]
