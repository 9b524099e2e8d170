"""A refused worker (issue 31 item 5): a denied worker id or a certificate from another CA.
It backs off exponentially instead of redialling every second, each side logs the episode
once, the worker's operator reads why in plain words, and nothing logs asyncio noise
(eof_received under TLS, futures never retrieved). Real coordd and coord-worker processes,
real mutual TLS over loopback; a counting TCP relay between them counts the dials."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from coordd.client import Client
from tests.integration.fleet_certs import Fleet, make_fleet
from tests.integration.workerbench import COOL, DAEMON_FAST, worker_toml

pytestmark = pytest.mark.timeout(90)


class CountingRelay:
    """127.0.0.1:port -> 127.0.0.1:`upstream`, counting the connections made (the dials)."""

    def __init__(self, upstream: int) -> None:
        self.upstream, self.port, self.dials = upstream, 0, 0
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.dials += 1
        self._writers.append(writer)
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.close()
            return
        self._writers.append(up_w)
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer),
                             return_exceptions=True)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for w in self._writers:
                w.transport.abort()
            await self._server.wait_closed()
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def fleet(tmp_path) -> Fleet:
    return make_fleet(tmp_path, time.time())


def start_worker(tmp_path: Path, fleet: Fleet, relay: CountingRelay, folder: Path,
                 standby: bool = False, **settings) -> tuple[subprocess.Popen, Path]:
    """coord-worker wa dialling coordd through `relay` (twice with `standby`: an active
    coordd and its standby, coordd.failover)."""
    (tmp_path / "readings.json").write_text(json.dumps(COOL))
    cfg = tmp_path / "wa.toml"
    cfg.write_text(worker_toml(tmp_path / "work", {"m": {"argv": [sys.executable, "-c", "0"]}},
                               **settings))
    log = tmp_path / "wa.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "--worker-id", "wa", "--roles", "cpu",
             *["--connect", f"tls://127.0.0.1:{relay.port}"] * (2 if standby else 1),
             "--cert", str(folder / "worker-wa.pem"),
             "--key", str(folder / "worker-wa.key"), "--ca", fleet.ca, "--config", str(cfg),
             "--readings-override", str(tmp_path / "readings.json")], stdout=fh, stderr=fh)
    return proc, log


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(5)


@pytest.mark.parametrize("case", ["denied_id", "other_ca", "denied_id_with_a_standby"])
async def test_a_refused_worker_backs_off_and_says_why_once(daemon_factory, fleet, tmp_path,
                                                             case):
    d = daemon_factory(DAEMON_FAST + fleet.config('tls_deny_workers = ["wa"]\n'
                                                  if case != "other_ca" else ""))
    d.start()
    relay = CountingRelay(fleet.port)
    folder = fleet.rogue_dir if case == "other_ca" else fleet.ca_dir
    # heartbeat_interval_s 0.5 (worker_toml): without the backoff, one connection redials
    # at that pace (~8 dials in the window below, ~16 with a standby's)
    proc, log = start_worker(tmp_path, fleet, relay, folder, standby=case.endswith("standby"))
    try:
        time.sleep(4.0)
        dials = relay.dials
    finally:
        code = stop(proc)
        relay.close()
    wlog = log.read_text()
    dlog = Path(d.log_path).read_text()
    # dials at ~0, then after 0.5-1, 1-2, 2-4 s (+ one connection that was already out):
    # 3 to 5 in the 4 s
    assert 2 <= dials <= 6, (dials, wlog)
    refused_lines = [ln for ln in dlog.splitlines() if "refused a T" in ln]
    assert len(refused_lines) == 1, dlog
    worker_lines = [ln for ln in wlog.splitlines() if "coordd refused this" in ln
                    and "goodbye not delivered" not in ln]  # (the stop's own line)
    assert len(worker_lines) == 1 and " ERROR " in worker_lines[0], wlog
    if case != "other_ca":
        assert "deny-list" in refused_lines[0] and "deny-list" in worker_lines[0]
    else:
        assert "unable to get local issuer certificate" in refused_lines[0]
        assert "issued by CN=rogue CA, not by the fleet CA" in worker_lines[0], wlog
    for noise in ("eof_received", "Traceback", "never retrieved", "Connection reset by peer"):
        assert noise not in dlog and noise not in wlog, (noise, dlog, wlog)
    assert code == 0, wlog


async def test_a_worker_refused_then_allowed_gets_in_at_its_next_try(daemon_factory, fleet,
                                                                      tmp_path):
    """The backoff is capped (refused_backoff_cap_s) and a reply ends the episode: once the
    deny-list no longer names it, the worker is in within the cap and says so."""
    d = daemon_factory(DAEMON_FAST + fleet.config('tls_deny_workers = ["wa"]\n'))
    d.start()
    relay = CountingRelay(fleet.port)
    proc, log = start_worker(tmp_path, fleet, relay, fleet.ca_dir, refused_backoff_cap_s=2)
    try:
        deadline = time.monotonic() + 15
        while "coordd refused this" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3.0)  # a few refusals: the backoff is at its cap
        Path(d.config).write_text(DAEMON_FAST + fleet.config())
        d.proc.send_signal(signal.SIGHUP)
        allowed = time.monotonic()
        async with Client(d.socket, timeout=5) as c:
            while time.monotonic() < allowed + 10:
                if "wa" in {w.worker_id for w in (await c.workers()).workers}:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(log.read_text())
        assert time.monotonic() - allowed < 2 + 3  # the cap, the reload and the poll (not 300 s)
    finally:
        assert stop(proc) == 0, log.read_text()
        relay.close()
    assert "coordd reachable again" in log.read_text()
