"""`coord-worker --readings-override FILE` is read like a config file (coordd.conffile):
never blocking, a regular file only, within a size cap, UTF-8. A FIFO, a huge file or bytes
that are not UTF-8 leave the heartbeat going with the last good override (worker.override),
one log line per change. Real coordd, real worker process, a real FIFO."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.integration.workerbench import COOL, bench  # noqa: F401  (the fixture)
from worker import override

pytestmark = pytest.mark.timeout(60)


async def test_fifo_huge_or_not_utf8_override_keeps_the_heartbeat_and_the_last_good(bench):  # noqa: F811
    path = bench.tmp / "readings.json"
    path.write_text(json.dumps({**COOL, "memory_used_pct": 12.5}))
    w = bench.start_worker(heartbeat_interval_s=0.2)

    async def view():
        got = [v for v in (await bench.client.workers()).workers if v.worker_id == "w1"]
        return got[0] if got else None

    async def heartbeats_go_on(memory: float | None) -> None:
        """Two more heartbeats arrive, each with `memory` (None: not the override's)."""
        for _ in range(2):
            seen = (await bench.until(view, what="worker seen")).heartbeat_at
            v = await bench.until(lambda: _newer(view, seen), timeout=5,
                                  what=f"a heartbeat after {seen}")
            got = v.readings["memory_used_pct"]
            assert (got == memory) if memory is not None else got not in (12.5, 33.0), v

    await bench.until(lambda: _memory_is(view, 12.5), what="the override in force")
    fifo = bench.tmp / "fifo"
    os.mkfifo(fifo)
    os.replace(fifo, path)  # a writer-less FIFO: an open() without O_NONBLOCK waits for ever
    await bench.until(lambda: _logged(w, "not a regular file"), timeout=5, what="FIFO line")
    await heartbeats_go_on(12.5)
    _put(path, b"{" + b" " * override.MAX_BYTES + b"}")
    await bench.until(lambda: _logged(w, "too large"), timeout=5, what="size line")
    await heartbeats_go_on(12.5)
    _put(path, b'{"memory_used_pct": 40.0, "note": "\xff"}')
    await bench.until(lambda: _logged(w, "not UTF-8"), timeout=5, what="UTF-8 line")
    await heartbeats_go_on(12.5)
    _put(path, b'{"memory_used_pct": ')  # a write caught half-way
    await bench.until(lambda: _logged(w, "not JSON"), timeout=5, what="JSON line")
    await heartbeats_go_on(12.5)
    _put(path, json.dumps({**COOL, "memory_used_pct": 33.0}).encode())
    await heartbeats_go_on(33.0)
    path.unlink()  # no file: the override ends, the measured readings go out
    await bench.until(lambda: _logged(w, "no such file"), timeout=5, what="absent line")
    await heartbeats_go_on(None)
    log = w.log()
    for text in ("not a regular file", "too large", "not UTF-8", "not JSON", "no such file"):
        assert log.count(text) == 1, log  # once per change, not once per heartbeat
    assert log.count("worker.override:") == 6, log  # those five and the good one between
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0, w.log()


def _put(path, data: bytes) -> None:
    """Replace the file at once (the heartbeat never sees it empty or half-written)."""
    tmp = path.with_name(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


async def _newer(view, seen: float):
    v = await view()
    return v if v is not None and v.heartbeat_at > seen else None


async def _memory_is(view, memory: float):
    v = await view()
    return v if v is not None and v.readings.get("memory_used_pct") == memory else None


async def _logged(w, text: str) -> bool:
    return text in w.log()
