"""`coordctl workers` for the worker lifecycle (issue 14): broken kinds, offline after a
goodbye, and `--forget ID [--force]`, against a real coordd."""

from __future__ import annotations

from coordd.client import SyncClient
from tests.integration.test_coordctl import COOL, ctl, ok, ok_json, refused


def test_workers_show_broken_kinds_offline_and_forget(daemon):
    with SyncClient(daemon.socket, timeout=10) as c:
        c.heartbeat("w1", ["cpu"], COOL, incarnation="i1", kinds=["m"],
                    broken_kinds={"embed": "cannot start /opt/x: [Errno 2] No such file"})
        c.heartbeat("w2", ["cpu"], COOL, incarnation="i2", kinds=["m"])
    human = ok(ctl(daemon.socket, "workers"))
    assert "w1: kind embed not usable: cannot start /opt/x: [Errno 2] No such file" in human
    doc = ok_json(ctl(daemon.socket, "--json", "workers"))
    w1 = next(w for w in doc["workers"] if w["worker_id"] == "w1")
    assert w1["kinds"] == ["m"] and w1["broken_kinds"] == {
        "embed": "cannot start /opt/x: [Errno 2] No such file"}
    line = refused(ctl(daemon.socket, "workers", "--forget", "w1"), 1, "invalid_state")
    assert "is live" in line
    refused(ctl(daemon.socket, "workers", "--force"), 2, "usage")
    refused(ctl(daemon.socket, "workers", "--forget", "nobody"), 1, "not_found")
    with SyncClient(daemon.socket, timeout=10) as c:
        assert c.goodbye("w1", "i1").released == []
    row = next(r for r in ok(ctl(daemon.socket, "workers")).splitlines()
               if r.strip().startswith("w1"))
    assert "offline" in row.split()
    assert ok(ctl(daemon.socket, "workers", "--forget", "w1")) == "worker w1 forgotten\n"
    assert ok(ctl(daemon.socket, "workers", "--forget", "w2", "--force")) == \
        "worker w2 forgotten\n"
    assert ok_json(ctl(daemon.socket, "--json", "workers"))["workers"] == []


def test_workers_and_show_print_gpus_and_resources_free_held(daemon):
    gpu0 = {"index": 0, "name": "Fake", "memory_total_mb": 16000, "memory_used_mb": 2000,
            "gpu_temperature_c": 61.0, "utilization_pct": 40.0}
    with SyncClient(daemon.socket, timeout=10) as c:
        c.heartbeat("w1", ["cpu"], {**COOL, "gpus": 1, "gpu_devices": [gpu0], "ram_mb": 8000})
    job = ok(ctl(daemon.socket, "enqueue", "--kind", "k", "--role", "cpu", "--priority", "1", "--payload", "{}",
                 "--resources", '{"vram_mb": 9000, "ram_mb": 1000}')).strip()
    big = ok(ctl(daemon.socket, "enqueue", "--kind", "k", "--role", "cpu", "--priority", "1", "--payload", "{}",
                 "--resources", '{"vram_mb": 9000}')).strip()
    refused(ctl(daemon.socket, "enqueue", "--kind", "k", "--role", "cpu", "--priority", "1", "--payload", "{}",
                "--resources", '{"vram_mb": -1}'), 1, "bad_request")
    with SyncClient(daemon.socket, timeout=10) as c:
        assert c.claim("w1", lease_s=60).job.job_id == job
    human = ok(ctl(daemon.socket, "workers"))
    assert "w1: gpu0: 2000/16000 MiB used, 9000 held, 7000 free, 61°C, 40% busy" in human
    assert "w1: ram: 8000 MiB, 1000 held, 7000 free" in human
    shown = ok(ctl(daemon.socket, "show", job))
    assert "gpus 1, vram 9000 MiB each, ram 1000 MiB (granted: gpus 1 (gpu0)" in shown
    waiting = ok(ctl(daemon.socket, "show", big))
    assert "vram: need 9000 MiB; free: 7000 on w1/gpu0" in waiting
