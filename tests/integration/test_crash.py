"""Crash rounds (issue 7, item 3): a real coordd under concurrent load, SIGKILLed at a random
moment. Every acknowledged operation must survive, nothing half-applied, and the file must
pass quick_check and the state-machine invariants; the restarted daemon must agree with it.

Default run: 3 rounds. `pytest -m slow tests/integration/test_crash.py`: 20 more.

SQLite only: the checks read the killed daemon's file (quick_check, foreign_key_check, the
job_counts the writer keeps). The same rounds on PostgreSQL, checked on its rows, are
test_pg_crash.py; coordd SIGKILLed mid-job with a real worker, on both stores, is
test_workflow_processes.py::test_sigkill_mid_graph_resumes_and_no_node_succeeds_twice.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from coordd import errors
from coordd.client import CallTimeout, Disconnected, SyncClient

COOL = {"memory_used_pct": 30.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 10_000.0}
STATUSES = ("waiting", "running", "succeeded", "failed", "cancelled")
N_ENQUEUERS = 2
N_WORKERS = 2


@dataclass
class Acked:
    """What the clients saw acknowledged (appended from several threads; list.append is atomic)."""

    enqueued: list[tuple[str, str]] = field(default_factory=list)    # (idempotency_key, job_id)
    completed: list[tuple[str, int, dict]] = field(default_factory=list)  # (job_id, token, result)
    claimed: list[tuple[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)                   # unexpected exceptions


def _enqueuer(sock: str, n: int, acked: Acked, stop: threading.Event, **fields: Any) -> None:
    """Enqueue until `stop` (more Enqueue `fields` on every job), recording each ack."""
    try:
        with SyncClient(sock, timeout=10) as c:
            i = 0
            while not stop.is_set():
                key = f"crash-{n}-{i}-{uuid.uuid4().hex[:8]}"
                res = c.enqueue(kind="k", required_role="cpu", priority=i % 4,
                                payload={"n": n, "i": i}, idempotency_key=key, **fields)
                acked.enqueued.append((key, res.job_id))
                i += 1
    except (Disconnected, CallTimeout):
        return
    except Exception as exc:  # noqa: BLE001 - report, the test asserts none
        acked.errors.append(f"enqueuer {n}: {type(exc).__name__}: {exc}")


def _worker(sock: str, n: int, acked: Acked, stop: threading.Event,
            lease_s: float = 600) -> None:
    """Heartbeat, claim (with a claim_id), complete until `stop`, recording each ack."""
    wid = f"w{n}"
    try:
        with SyncClient(sock, timeout=10) as c:
            k = 0
            while not stop.is_set():
                c.heartbeat(wid, ["cpu"], COOL)
                got = c.claim(wid, lease_s=lease_s, claim_id=uuid.uuid4().hex)
                if got.job is None:
                    time.sleep(0.005)
                    continue
                acked.claimed.append((got.job.job_id, got.lease.token))
                result = {"by": wid, "k": k, "job": got.job.job_id}
                k += 1
                try:
                    res = c.complete(got.job.job_id, wid, got.lease.token, result)
                except (errors.LeaseLost, errors.LeaseExpired, errors.AlreadyCompleted) as exc:
                    acked.errors.append(f"worker {wid}: unexpected {exc.code} on a fresh lease")
                    continue
                if res.status == "succeeded":
                    acked.completed.append((got.job.job_id, got.lease.token, result))
    except (Disconnected, CallTimeout):
        return
    except Exception as exc:  # noqa: BLE001
        acked.errors.append(f"worker {wid}: {type(exc).__name__}: {exc}")


def _ro(db: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)


def check_file(db: str, acked: Acked) -> dict[str, int]:
    """Every check on the killed daemon's files; returns the table's counts by status."""
    conn = _ro(db)
    try:
        qc = [r[0] for r in conn.execute("PRAGMA quick_check")]
        assert qc == ["ok"], f"quick_check: {qc}"
        fk = conn.execute("PRAGMA foreign_key_check").fetchall()
        assert fk == [], f"foreign_key_check: {fk}"
        jobs = {r[0]: r[1:] for r in conn.execute(
            "SELECT job_id, status, result_json, last_token, idempotency_key, finished_at "
            "FROM jobs")}
        leases = conn.execute("SELECT job_id, token FROM leases").fetchall()
        # the counters the writer keeps went into each batch's own transaction: the killed
        # file's job_counts equal a full count (coordd.store.sqlite.job_changes)
        stored = sorted(r for r in conn.execute("SELECT status, priority, n FROM job_counts")
                        if r[2])
        full = sorted(conn.execute(
            "SELECT status, priority, count(*) FROM jobs GROUP BY status, priority"))
        assert stored == full, f"job_counts {stored} != a full count {full}"
    finally:
        conn.close()

    # every acknowledged enqueue's job exists, under its idempotency key
    for key, job_id in acked.enqueued:
        assert job_id in jobs, f"acknowledged enqueue {job_id} ({key}) lost"
        assert jobs[job_id][3] == key, f"{job_id}: idempotency key {jobs[job_id][3]!r} != {key!r}"
    # every acknowledged complete: succeeded with exactly that result
    for job_id, token, result in acked.completed:
        status, result_json, _last, _key, _fin = jobs[job_id]
        assert status == "succeeded", f"acknowledged complete of {job_id} is now {status}"
        assert json.loads(result_json) == result, f"{job_id}: result {result_json} != {result}"
    # leases: at most one per job (PK, but check), running iff a lease, token == last_token
    lease_jobs = [j for j, _t in leases]
    assert len(lease_jobs) == len(set(lease_jobs)), "two leases for one job"
    lease_tok = dict(leases)
    for job_id, (status, result_json, last_token, _key, finished_at) in jobs.items():
        has = job_id in lease_tok
        assert (status == "running") == has, f"{job_id}: status {status}, lease {has}"
        if has:
            assert lease_tok[job_id] == last_token, \
                f"{job_id}: lease token {lease_tok[job_id]} != last_token {last_token}"
        if status == "succeeded":  # never half-applied
            assert result_json is not None and finished_at is not None, f"{job_id} half-done"
        else:
            assert result_json is None, f"{job_id}: {status} with a result"
    for job_id, token in acked.claimed:  # tokens only grow
        assert jobs[job_id][2] >= token, f"{job_id}: last_token went back below {token}"
    counts = {s: 0 for s in STATUSES}
    for status, *_ in jobs.values():
        counts[status] += 1
    counts["_leases"] = len(leases)
    return counts


def crash_round(daemon_factory, seed: int) -> dict[str, int]:
    rnd = random.Random(seed)
    d = daemon_factory(name=f"r{seed}")
    d.start()
    acked = Acked()
    stop = threading.Event()
    threads = [threading.Thread(target=_enqueuer, args=(d.socket, n, acked, stop), daemon=True)
               for n in range(N_ENQUEUERS)]
    threads += [threading.Thread(target=_worker, args=(d.socket, n, acked, stop), daemon=True)
                for n in range(N_WORKERS)]
    for t in threads:
        t.start()
    time.sleep(rnd.uniform(0.2, 1.0))
    d.kill()
    for t in threads:
        t.join(15)
    stop.set()
    assert not any(t.is_alive() for t in threads), "a client hung after the kill"
    assert not acked.errors, acked.errors

    counts = check_file(d.db, acked)

    d.start()  # same files
    with SyncClient(d.socket, timeout=10) as c:
        st = c.status()
        assert {s: st.jobs.get(s, 0) for s in STATUSES} == \
            {s: counts[s] for s in STATUSES}, (st.jobs, counts)
        assert st.active_leases == counts["_leases"]
        for _key, job_id in acked.enqueued[-3:]:
            assert c.get_job(job_id).job_id == job_id
        for job_id, _tok, result in acked.completed[-3:]:
            view = c.get_job(job_id)
            assert view.status == "succeeded"
        # it serves writes too; a resent acknowledged enqueue names the same job
        if acked.enqueued:
            key, job_id = acked.enqueued[-1]
            n, i = (int(x) for x in key.split("-")[1:3])  # the same request as sent
            again = c.enqueue(kind="k", required_role="cpu", priority=i % 4,
                              payload={"n": n, "i": i}, idempotency_key=key)
            assert again.job_id == job_id and not again.created
    assert d.stop() == 0
    check_file(d.db, acked)
    summary = {"enqueued": len(acked.enqueued), "completed": len(acked.completed),
               **counts}
    print(f"crash round seed={seed}: {summary}")
    return summary


def _run(daemon_factory, seed):
    s = crash_round(daemon_factory, seed)
    assert s["enqueued"] > 0, "no enqueue acknowledged before the kill: the round proved nothing"


@pytest.mark.parametrize("seed", range(3))
def test_sigkill_under_load_loses_nothing_acknowledged(daemon_factory, seed):
    _run(daemon_factory, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 120))
def test_sigkill_under_load_loses_nothing_acknowledged_slow(daemon_factory, seed):
    _run(daemon_factory, seed)
