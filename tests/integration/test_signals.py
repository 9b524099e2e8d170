"""What each long-running program does with the signals operators and systemd send: real
processes, real signals, their log output read back.

coordd and coord-worker handle SIGHUP (systemctl reload, logrotate) and keep running;
a graceful stop of a worker logs the stop and its hand-backs, never "coordd unreachable".
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.integration.workerbench import bench, store_bench  # noqa: F401  (the fixtures)

pytestmark = pytest.mark.timeout(60)


async def _log_has(read, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in (got := read()):
        assert time.monotonic() < deadline, f"{text!r} not logged in {timeout}s: {got[-2000:]}"
        await asyncio.sleep(0.05)
    return got


@pytest.mark.parametrize("holding", [True, False], ids=["holding_a_job", "idle"])
async def test_graceful_worker_stop_logs_the_stop_not_coordd_unreachable(store_bench, holding):  # noqa: F811
    """On both stores: the hand-back of a held lease, or a goodbye that ends a parked claim."""
    bench = store_bench
    w = bench.start_worker(lease_s=30, grace_s=0.5, claim_interval_s=0.2)
    await _log_has(w.log, "started")
    job = None
    if holding:
        job = await bench.enqueue({"sleep": 60})
        await bench.model_pids(job, "w1")
    else:
        await asyncio.sleep(0.5)  # its claim parked at coordd
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0
    log = w.log()
    assert "stopping: " in log and "stopped" in log, log
    stop = log[log.index("stopping: "):]
    assert "unreachable" not in log and "WARNING" not in stop, log  # a stop is routine
    assert "ERROR" not in log and "Traceback" not in log, log
    if job is None:
        assert "stopping: no job held" in log, log
    else:
        assert f"stopping: 1 job(s): {job} handing back (its model is running)" in log, log
        assert f"job {job}: handed back (worker_shutdown)" in log, log
        view = await bench.client.get_job(job)
        assert view.status == "waiting" and view.last_error == "released: worker_shutdown"


async def test_a_call_cut_short_by_our_own_close_is_not_an_outage(daemon):
    """Client.close() fails its calls in flight with Closed, which worker.link ignores; a
    connection coordd drops is still Disconnected (an outage)."""
    from coordd.client import Client, Closed, Disconnected
    from worker.link import Link
    client = Client(daemon.socket, timeout=10)
    parked = asyncio.ensure_future(client.claim("w9", 30, "c1", wait_s=5))
    await asyncio.sleep(0.3)
    await client.close()
    with pytest.raises(Closed) as got:
        await parked
    link = Link()
    link.failed(got.value)
    assert not link.down
    link.failed(Disconnected("coordd closed the connection"))
    assert link.down


async def test_sighup_to_coordd_without_tcp_reloads_nothing_and_keeps_serving(daemon_factory):
    d = daemon_factory("reaper_interval_s = 5\n")
    d.start()
    from coordd.client import Client
    async with Client(d.socket, timeout=10) as c:
        job = (await c.enqueue(kind="k", required_role="cpu", priority=1)).job_id
        d.proc.send_signal(signal.SIGHUP)
        await _log_has(d.log, "SIGHUP: nothing to reload (no TCP listener)")
        assert d.proc.poll() is None and (await c.status()).jobs["waiting"] == 1
        with open(d.config, "w") as fh:  # an edit a reload cannot apply: said so
            fh.write("reaper_interval_s = 7\nheartbeat_stale_s = 40\n")
        d.proc.send_signal(signal.SIGHUP)
        await _log_has(d.log, "applied at the next restart: heartbeat_stale_s, reaper_interval_s")
        with open(d.config, "w") as fh:  # a file that no longer loads changes nothing
            fh.write("reaper_interval_s = 0\n")
        d.proc.send_signal(signal.SIGHUP)
        await _log_has(d.log, "the running settings are unchanged")
        assert (await c.get_job(job)).status == "waiting" and d.proc.poll() is None
    assert d.stop() == 0 and "Traceback" not in d.log()


async def test_sighup_to_a_worker_holding_a_job_is_logged_and_changes_nothing(bench):  # noqa: F811
    w = bench.start_worker(lease_s=30, grace_s=0.5)
    job = await bench.enqueue({"sleep": 60})
    pids = await bench.model_pids(job, "w1")
    w.proc.send_signal(signal.SIGHUP)
    await _log_has(w.log, "SIGHUP: nothing to reload")
    await asyncio.sleep(0.3)
    assert w.proc.poll() is None and all(psutil_alive(p) for p in pids), w.log()
    assert (await bench.client.get_job(job)).status == "running"
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0
    assert f"job {job}: handed back (worker_shutdown)" in w.log()


async def test_a_worker_started_with_sigchld_ignored_still_reads_its_models_exit_codes(bench):  # noqa: F811
    """SIG_IGN is kept across exec, so a worker can be started with SIGCHLD ignored (a
    parent's `trap '' CHLD`, some process supervisors). Then the kernel reaps the models
    itself and their exit codes are lost; a failed model must still fail with its code."""
    ignored = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # for the worker to inherit
    try:
        w = bench.start_worker()
    finally:
        signal.signal(signal.SIGCHLD, ignored)
    job = await bench.enqueue({"exit": 3, "stderr": "bad input\n"})
    view = await bench.status_is(job, "failed", "succeeded")
    assert view.status == "failed" and view.last_error.startswith("permanent: exit 3"), w.log()


async def test_models_start_with_the_default_of_a_signal_the_worker_inherited_ignored(bench):  # noqa: F811
    """A background job of a non-interactive shell starts with SIGINT and SIGQUIT ignored,
    and exec keeps SIG_IGN: the worker must not pass that on to its models (uvloop's spawn
    reset every signal for the child; Popen does not)."""
    asked = [signal.SIGQUIT, signal.SIGUSR1, signal.SIGINT]
    before = {s: signal.signal(s, signal.SIG_IGN) for s in asked}  # for the worker to inherit
    try:
        w = bench.start_worker()
    finally:
        for s, old in before.items():
            signal.signal(s, old)
    job = await bench.enqueue({"ignored": [int(s) for s in asked]})
    view = await bench.status_is(job, "succeeded", "failed")
    assert view.status == "succeeded", (view.last_error, w.log())
    assert view.result["ignored"] == [], view.result


def psutil_alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sighup_stops_the_web_view_gracefully_and_the_mcp_server(daemon, tmp_path):
    """coordd-web and coordd-mcp are session programs: a hangup ends them (the web view
    through uvicorn's graceful shutdown, as SIGTERM does)."""
    import subprocess
    import sys
    from tests.integration.webtools import start_web
    web = start_web(tmp_path, daemon.socket)
    try:
        web.proc.send_signal(signal.SIGHUP)
        assert web.proc.wait(10) in (0, -signal.SIGTERM)
        assert "Traceback" not in web.log_path.read_text()
    finally:
        web.stop()
    # SIG_IGN is inherited across exec (a test run under nohup has it): the default
    # action is what a session program started from a terminal has
    mcp = subprocess.Popen([sys.executable, "-m", "coordd_mcp", "--socket", daemon.socket],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE,
                           preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        time.sleep(0.5)
        mcp.send_signal(signal.SIGHUP)
        assert mcp.wait(10) == -signal.SIGHUP
    finally:
        if mcp.poll() is None:
            mcp.kill()
            mcp.wait(5)
        for f in (mcp.stdin, mcp.stdout, mcp.stderr):
            f.close()


async def test_sighup_with_a_config_that_became_a_fifo_huge_or_not_utf8_keeps_serving(
        daemon_factory):
    """The re-read on SIGHUP runs on coordd's event loop: a FIFO nobody writes hung it for
    good, a huge file stalled it, bytes not UTF-8 were a traceback. Each is one error line
    now, the running settings unchanged, and coordd answers at once."""
    import os
    from pathlib import Path
    from coordd import conffile
    from coordd.client import Client
    d = daemon_factory("reaper_interval_s = 5\n")
    d.start()
    async with Client(d.socket, timeout=10) as c:
        for make, why in [
                (lambda p: os.mkfifo(p), "not a regular file"),
                (lambda p: Path(p).write_text("#" * (conffile.MAX_BYTES + 1)),
                 f"over {conffile.MAX_BYTES} bytes"),
                (lambda p: Path(p).write_bytes(b"reaper_interval_s = 5 # \xff\n"),
                 "not UTF-8 text")]:
            os.unlink(d.config)
            make(d.config)
            d.proc.send_signal(signal.SIGHUP)
            await _log_has(d.log, f"SIGHUP: config {d.config}: {why}")
            t0 = time.monotonic()
            assert (await asyncio.wait_for(c.status(), 5)).jobs["waiting"] == 0
            assert time.monotonic() - t0 < 2.0
    assert d.proc.poll() is None
    assert d.stop() == 0 and "Traceback" not in d.log(), d.log()


def _hup_handled(pid: int) -> bool | None:
    """Whether SIGHUP is ignored or caught in `pid` (None: it has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    masks = {k: int(v, 16) for k, v in (line.split(":\t") for line in status.splitlines()
                                        if line.startswith(("SigIgn", "SigCgt")))}
    return bool((masks["SigIgn"] | masks["SigCgt"]) & (1 << (signal.SIGHUP - 1)))


def _uvloop_mapped(pid: int) -> bool:
    try:
        return "uvloop/loop." in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def _hup_from_the_start(proc, ready) -> int:
    """Watch `proc` start: once uvloop's library is loaded (before coordd.daemon.server and
    worker.supervisor are imported, and well before the event loop's SIGHUP handler),
    SIGHUP must already be ignored; then a SIGHUP every 5 ms until `ready()`. Returns the
    SIGHUPs sent."""
    deadline, sent = time.monotonic() + 30, 0
    while not _uvloop_mapped(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
        time.sleep(0.0005)
    assert _hup_handled(proc.pid), "SIGHUP still has its default action (ends the process)"
    while not ready():
        assert proc.poll() is None, f"exited {proc.returncode} after {sent} SIGHUPs"
        assert time.monotonic() < deadline
        proc.send_signal(signal.SIGHUP)
        sent += 1
        time.sleep(0.005)
    return sent


def test_sighup_during_start_up_does_not_end_coordd(daemon_factory):
    """Before the event loop's handler, SIGHUP's default action ended coordd (~0.3 s of
    imports and the config read: a logrotate `kill -HUP` as coordd restarts)."""
    d = daemon_factory("reaper_interval_s = 5\n")
    proc = d.start(wait=False)
    sent = _hup_from_the_start(proc, lambda: "coordd serving on" in d.log())
    d.wait_ready()
    assert sent > 0 and proc.poll() is None
    assert d.stop() == 0


async def test_sighup_during_start_up_does_not_end_a_worker(bench):  # noqa: F811
    w = bench.start_worker(lease_s=30, grace_s=0.5)
    sent = _hup_from_the_start(w.proc, lambda: "started" in w.log())
    job = await bench.enqueue({"sleep": 60})
    pids = await bench.model_pids(job, "w1")
    assert sent > 0 and w.proc.poll() is None, w.log()
    assert [_hup_handled(p) for p in pids] == [False] * len(pids)  # models: the default
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0
