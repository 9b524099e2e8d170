"""The store conformance fixtures: one `store` per test, parametrised over SQLite and
PostgreSQL.

PostgreSQL runs in a throwaway cluster started once per session as a non-root user
(tests/conftest.py `pg_dsn`, coordd.store.postgres.throwaway; shared/FLEET.md B2), its
tables truncated between tests; its cases skip, with the reason, where asyncpg or the server binaries are missing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from coordd import config as config_mod
from coordd.store.sqlite import leases
from coordd.clock import FakeClock
from coordd.ids import JobIds
from coordd.store.api import NewJob
from coordd.store.sqlite.store import SQLiteStore

T0 = 100.0
COOL = {"memory_used_pct": 40.0, "temperature_c": 50.0, "on_battery": False,
        "user_idle_s": 3600.0}


async def open_store(kind: str, request: Any, tmp_path: Any, **kw: Any) -> Any:
    """A started, empty store of `kind` ("sqlite" or "postgres")."""
    if kind == "sqlite":
        st = SQLiteStore(str(tmp_path / "store.db"), FakeClock(T0))
        await st.start()
        return st
    dsn = request.getfixturevalue("pg_dsn")  # skips first where PostgreSQL is missing
    from coordd.store.postgres import PostgresStore
    st = PostgresStore(dsn, **kw)
    await st.start()
    await st.truncate()
    return st


@dataclass
class Bundle:
    """A store and what its tests need: gate policy, job ids in FIFO order, helpers."""

    store: Any
    kind: str
    policy: leases.ClaimPolicy
    ids: JobIds = field(default_factory=JobIds)

    def job(self, priority: int = 2, role: str = "cpu", kind: str = "k",
            **kw: Any) -> NewJob:
        """A valid NewJob with a fresh, time-ordered id."""
        return NewJob(job_id=self.ids.new(T0), kind=kind, required_role=role,
                      priority=priority, payload_json=kw.pop("payload_json", "{}"),
                      run_at=kw.pop("run_at", None), max_attempts=kw.pop("max_attempts", 3),
                      idempotency_key=kw.pop("idempotency_key", None),
                      max_runtime_s=kw.pop("max_runtime_s", None), gates_json=None, **kw)

    async def enqueue(self, now: float = T0, **kw: Any) -> str:
        return (await self.store.enqueue([self.job(**kw)], now=now))[0].job_id

    async def worker(self, worker_id: str, now: float = T0, roles: list[str] | None = None,
                     **readings: Any) -> None:
        await self.store.heartbeat(worker_id, roles or ["cpu"], {**COOL, **readings}, now=now)

    async def claim(self, worker_id: str, now: float, lease_s: float = 30.0, **kw: Any) -> Any:
        return await self.store.claim(worker_id, lease_s, self.policy, now=now, **kw)


def policy(**overrides: Any) -> leases.ClaimPolicy:
    cfg = config_mod.load(None, **overrides)
    return leases.ClaimPolicy(policies=cfg.policies(), heartbeat_stale_s=cfg.heartbeat_stale_s,
                              aging_interval_s=0.0)


@pytest.fixture(params=["sqlite", "postgres"])
async def bundle(request: Any, tmp_path: Any) -> AsyncIterator[Bundle]:
    """A Bundle over each store in turn."""
    st = await open_store(request.param, request, tmp_path)
    try:
        yield Bundle(store=st, kind=request.param, policy=policy())
    finally:
        await st.close()


@pytest.fixture
async def pg(request: Any, tmp_path: Any) -> AsyncIterator[Bundle]:
    """A Bundle over PostgreSQL alone, its pool large enough for 20 concurrent callers."""
    st = await open_store("postgres", request, tmp_path, pool_max=20)
    try:
        yield Bundle(store=st, kind="postgres", policy=policy())
    finally:
        await st.close()
