"""A full disk under a running job (issue 21, finding 5): the model succeeds while coordd's
disk is full; the worker's `complete` is refused `unavailable` and retried (never turned
into a `fail`) until space returns; the result is then stored once, on the first attempt."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

from coordd.client import Client

from test_hostile_files import fill_disk, tmpfs  # noqa: F401  (tmpfs: the fixture)
from tests.integration.workerbench import until

MODEL = textwrap.dedent("""
    import json, os, time
    p = json.load(open(os.environ["COORD_PAYLOAD"]))
    while not os.path.exists(p["go"]):
        time.sleep(0.02)
    with open(os.environ["COORD_RESULT"], "w") as fh:
        json.dump({"pad": "x" * p["pad"]}, fh)
""")
COOL = {"memory_used_pct": 30.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 10_000.0}
PAD = 600_000  # inline result: the WAL must grow to take it, and the disk is full


async def test_complete_refused_by_a_full_disk_is_retried_not_failed(tmpfs, daemon_factory,
                                                                       tmp_path):
    folder = tmpfs("full_run", "size=4m")
    d = daemon_factory("reaper_interval_s = 0.3\n", name="fullrun")
    d.db = str(folder / "c.db")
    d.start()
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    override = tmp_path / "readings.json"
    override.write_text(json.dumps(COOL))
    cfg = tmp_path / "w.toml"
    cfg.write_text(textwrap.dedent(f"""
        lease_s = 20
        heartbeat_interval_s = 0.5
        claim_interval_s = 0.1
        inline_result_bytes = 2000000
        work_dir = {json.dumps(str(tmp_path / "work"))}
        [kinds.m]
        argv = [{json.dumps(sys.executable)}, {json.dumps(str(model))}]
        max_result_bytes = 2000000
    """))
    wlog = tmp_path / "w.log"
    with open(wlog, "ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker", "--worker-id", "w1", "--roles", "cpu",
             "--socket", d.socket, "--config", str(cfg), "--readings-override", str(override)],
            stdout=log, stderr=log)
    go = tmp_path / "go"
    filler = folder / "filler"
    try:
        async with Client(d.socket, timeout=10) as c:
            job_id = (await c.enqueue(kind="m", required_role="cpu", priority=1,
                                      payload={"go": str(go), "pad": PAD})).job_id

            async def running():
                return (await c.get_job(job_id)).status == "running"
            await until(running, 20, "job running")
            fill_disk(filler)  # take every free byte of coordd's disk
            go.touch()  # the model succeeds now

            async def retrying():
                return "not stored yet, retrying until the lease ends" in wlog.read_text()
            await until(retrying, 20, "complete refused and retried")
            await asyncio.sleep(1.0)  # several retries, all refused
            job = await c.get_job(job_id)
            assert job.status == "running", (job.status, job.last_error, wlog.read_text())
            st = await c.status()
            assert any(w.startswith("disk full") for w in st.warnings), st.warnings
            filler.unlink()

            async def stored():
                j = await c.get_job(job_id)
                return j if j.status not in ("running", "waiting") else None
            job = await until(stored, 20, "result stored once space returned")
            assert job.status == "succeeded", (job.status, job.last_error, wlog.read_text())
            assert job.attempts == 1, job.attempts
            assert len(job.result["pad"]) == PAD
            moves = [e.to_status for e in job.events]
            assert moves == ["waiting", "running", "succeeded"], moves
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)
        if filler.exists():
            os.unlink(filler)
    log = d.log()
    assert log.count("storage refused a write") == 1, log
    assert "Traceback" not in log, log


DRAIN_JOBS = 2000


async def test_a_disk_smaller_than_the_wal_limit_takes_writes_again_after_it_fills(
        tmpfs, daemon_factory):
    """16 MiB of disk under the default 64 MiB WAL size limit, a drain (4 clients claiming
    and completing with 2 KiB results), the disk filled mid-drain and then freed: every job
    ends succeeded. Before the WAL was bounded by the free space it grew into the space
    freed (the retries' commits) before a checkpoint could grow the database into it, the
    checkpoint then failed for want of that space, the WAL could not restart, and the disk
    stayed full for good."""
    from coordd import errors
    folder = tmpfs("small_disk", "size=16m")
    d = daemon_factory("heartbeat_stale_s = 86400.0\n", name="smalldisk")
    d.db = str(folder / "c.db")
    d.start()
    filler = folder / "filler"
    done: set[str] = set()

    async def retried(fn):
        while True:
            try:
                return await fn()
            except (errors.Unavailable, errors.Overloaded):
                await asyncio.sleep(0.05)

    async def drain(k: int) -> None:
        wid = f"w{k}"
        async with Client(d.socket, timeout=30) as c:
            await retried(lambda: c.heartbeat(wid, ["cpu"], COOL))
            while True:
                got = await retried(lambda: c.claim(wid, lease_s=600))
                if got.job is None:
                    return
                await retried(lambda: c.complete(got.job.job_id, wid, got.lease.token,
                                                 {"pad": "r" * 2048}))
                done.add(got.job.job_id)

    async with Client(d.socket, timeout=30) as c:
        for i in range(0, DRAIN_JOBS, 500):
            await c.enqueue_batch([{"kind": "k", "required_role": "cpu", "priority": 1,
                                    "payload": {"i": j}} for j in range(i, i + 500)])
        drains = [asyncio.create_task(drain(k)) for k in range(4)]
        try:
            while len(done) < DRAIN_JOBS // 3:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(fill_disk, filler)
            await asyncio.sleep(1.0)
            filler.unlink()
            finished, _ = await asyncio.wait(drains, timeout=30)
            assert len(finished) == 4, f"{len(done)} of {DRAIN_JOBS} done, the disk " \
                f"stays full: {os.statvfs(folder).f_bavail} blocks free; " \
                f"{[(p.name, p.stat().st_size) for p in folder.iterdir()]}; {d.log()[-1500:]}"
            for t in finished:
                t.result()
        finally:
            for t in drains:
                t.cancel()
        st = await c.status()
        assert st.jobs["succeeded"] == DRAIN_JOBS, st.jobs
