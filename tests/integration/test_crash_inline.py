"""A real coordd with ONE client connection, SIGKILLed at a random moment: with a lone peer
the SQLite writer commits each request inline, in the request's own step
(coordd.store.sqlite.writer `submit`); every enqueue, claim and complete acknowledged
before the kill is in the file (the reply followed its COMMIT), the file checks clean.
SQLite only: the checks read the killed daemon's file (tests/integration/test_crash.py)."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest

from coordd.client import CallTimeout, Disconnected, SyncClient

from tests.integration.test_crash import COOL, Acked, check_file


def _one_connection(sock: str, acked: Acked, stop: threading.Event) -> None:
    """Enqueue, claim and complete on one connection until the kill, recording each ack."""
    try:
        with SyncClient(sock, timeout=10) as c:
            c.heartbeat("w1", ["cpu"], COOL)
            i = 0
            while not stop.is_set():
                key = f"inline-{i}-{uuid.uuid4().hex[:8]}"
                res = c.enqueue(kind="k", required_role="cpu", priority=i % 4,
                                payload={"i": i}, idempotency_key=key)
                acked.enqueued.append((key, res.job_id))
                if i % 2:
                    got = c.claim("w1", lease_s=600, claim_id=uuid.uuid4().hex)
                    if got.job is not None:
                        acked.claimed.append((got.job.job_id, got.lease.token))
                        result = {"i": i, "job": got.job.job_id}
                        done = c.complete(got.job.job_id, "w1", got.lease.token, result)
                        if done.status == "succeeded":
                            acked.completed.append((got.job.job_id, got.lease.token, result))
                i += 1
    except (Disconnected, CallTimeout):
        return
    except Exception as exc:  # noqa: BLE001 - report, the test asserts none
        acked.errors.append(f"{type(exc).__name__}: {exc}")


def test_sigkill_with_one_connection_loses_nothing_acknowledged(daemon_factory):
    _round(daemon_factory, 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 6))
def test_sigkill_with_one_connection_loses_nothing_acknowledged_slow(daemon_factory, seed):
    _round(daemon_factory, seed)


def _round(daemon_factory, seed: int) -> None:
    d = daemon_factory(name=f"inline{seed}")
    d.start()
    acked, stop = Acked(), threading.Event()
    t = threading.Thread(target=_one_connection, args=(d.socket, acked, stop), daemon=True)
    t.start()
    time.sleep(random.Random(seed).uniform(0.3, 0.8))
    d.kill()
    t.join(15)
    stop.set()
    assert not t.is_alive(), "the client hung after the kill"
    assert not acked.errors, acked.errors
    assert acked.enqueued and acked.completed, "nothing acknowledged: the round proved nothing"
    check_file(d.db, acked)
