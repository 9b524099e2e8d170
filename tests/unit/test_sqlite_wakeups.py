"""The SQLite store's side of the parked calls' wake-ups (coordd.store.sqlite.wakeups):
what it notes to the coordinator's Push and when, with a recording Push in its place."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from coordd.clock import FakeClock
from coordd.store import NewJob
from coordd.store.api import StoreHooks
from coordd.store.sqlite.store import SQLiteStore

T0 = 1_000.0
COOL = {"memory_used_pct": 40.0, "temperature_c": 50.0, "on_battery": False,
        "user_idle_s": 3600.0}


class Recorder:
    """What a Push hears from the store, in order."""

    def __init__(self) -> None:
        self.heard: list[tuple[Any, ...]] = []
        self.scheduled: Any = None
        self.events_moved: Any = None

    def start(self, scheduled: Any, events_moved: Any = None) -> None:
        self.scheduled, self.events_moved = scheduled, events_moved

    def note(self, what: str, job_id: str, a: Any, b: Any, c: Any) -> None:
        self.heard.append((what, job_id))

    def job_waiting(self, job_id: str, role: str, kind: str, run_at: float | None) -> None:
        self.heard.append(("w", job_id))

    def job_ended(self, job_id: str) -> None:
        self.heard.append(("t", job_id))

    def committed(self) -> None:
        self.heard.append(("commit",))

    def rolled_back(self) -> None:
        self.heard.append(("rollback",))

    def clock_stepped(self, step_s: float) -> None:
        self.heard.append(("step", step_s))


def job(job_id: str, run_at: float | None = None) -> NewJob:
    return NewJob(job_id=job_id, kind="k", required_role="cpu", priority=2,
                  payload_json="{}", run_at=run_at, max_attempts=3, idempotency_key=None,
                  max_runtime_s=None, gates_json=None)


async def test_heartbeats_are_noted_only_while_a_claim_is_parked(tmp_path):
    store = SQLiteStore(str(tmp_path / "w.db"), FakeClock(T0))
    push = Recorder()
    store.attach(StoreHooks(policy=SimpleNamespace(), reservations=None, push=push,
                            meters=None, backoff=None))
    store.claims_parked(True)  # before the writer is open: nothing to tell, no error
    await store.start()
    try:
        await store.heartbeat("w1", ["cpu"], COOL, now=T0)
        assert ("h", "w1") not in push.heard and push.heard[-1] == ("commit",)
        store.claims_parked(True)
        push.heard.clear()
        await store.heartbeat("w1", ["cpu"], COOL, now=T0 + 1)
        assert push.heard == [("h", "w1"), ("commit",)]  # noted, then the COMMIT
        store.claims_parked(False)
        push.heard.clear()
        await store.heartbeat("w1", ["cpu"], COOL, now=T0 + 2)
        assert push.heard == [("commit",)]
    finally:
        await store.close()
    store.claims_parked(True)  # the writer's connection is closed: swallowed


async def test_push_starts_with_the_jobs_not_yet_due_and_new_events(tmp_path):
    store = SQLiteStore(str(tmp_path / "w.db"), FakeClock(T0))
    push = Recorder()
    store.attach(StoreHooks(policy=SimpleNamespace(), reservations=None, push=push,
                            meters=None, backoff=None))
    await store.start()
    try:
        assert push.scheduled(T0) == [] and push.events_moved() is False
        await store.enqueue([job("j1", run_at=T0 + 60), job("j2")], now=T0)
        assert push.events_moved() is True and push.events_moved() is False
        assert push.scheduled(T0) == [(T0 + 60, "cpu", "k")]
        assert push.scheduled(T0 + 60) == []
    finally:
        await store.close()
