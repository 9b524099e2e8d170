"""Shared fixtures: a Coordinator on a temporary DB with a pinned clock."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import uvloop

from coordd import config as config_mod
from coordd.clock import FakeClock
from coordd.wire.protocol import Claim, Enqueue, Heartbeat
from coordd.daemon.server import sqlite_coordinator
from coordd.service import Coordinator

T0 = 100.0

COOL = {"memory_used_pct": 40.0, "temperature_c": 50.0, "on_battery": False,
        "user_idle_s": 3600.0}


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Any]:
    """Run every async test on uvloop, as coordd does in production."""
    return {"uvloop": uvloop.new_event_loop}


@dataclass
class Bundle:
    """What a core test needs: the coordinator, its clock and DB path."""

    coord: Coordinator
    clock: FakeClock
    db_path: str

    async def worker(self, worker_id: str, roles: list[str] | None = None,
                     **readings: Any) -> None:
        """Send a heartbeat with cool, idle, mains readings unless overridden."""
        await self.coord.heartbeat(Heartbeat(worker_id=worker_id, roles=roles or ["cpu"],
                                             readings={**COOL, **readings}))

    async def enqueue(self, priority: int = 2, role: str = "cpu", kind: str = "k",
                      **kw: Any) -> str:
        res = await self.coord.enqueue(Enqueue(kind=kind, required_role=role,
                                               priority=priority, payload=kw.pop("payload", {}),
                                               **kw))
        return res.job_id

    async def claim(self, worker_id: str, lease_s: float | None = 30.0, **kw: Any):
        return await self.coord.claim(Claim(worker_id=worker_id, lease_s=lease_s, **kw))


@pytest.fixture
async def make_bundle(tmp_path):
    """Factory: build a started Bundle with config overrides; closes them all at teardown."""
    made: list[Bundle] = []

    async def make(**overrides: Any) -> Bundle:
        clock = FakeClock(T0)
        cfg = config_mod.load(None, **overrides)
        path = str(tmp_path / f"coordd{len(made)}.db")
        coord = sqlite_coordinator(path, cfg, clock, rng=random.Random(7))
        await coord.start()
        b = Bundle(coord, clock, path)
        made.append(b)
        return b

    yield make
    for b in made:
        await b.coord.close()


@pytest.fixture
async def bundle(make_bundle) -> AsyncIterator[Bundle]:
    yield await make_bundle()


# ---------------------------------------------------------------- PostgreSQL (issue 20)
# One throwaway cluster per session, shared by tests/store and the daemon tests (one port).

def _pg_missing() -> str | None:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg is not installed (pip install -e '.[postgres]')"
    from coordd.store.postgres import throwaway
    if throwaway.binaries() is None:
        return "PostgreSQL server binaries not found (apt-get install postgresql)"
    return None


@pytest.fixture(scope="session")
def pg_dsn() -> Any:
    """The DSN of the session's throwaway cluster (started on first use)."""
    why = _pg_missing()
    if why is not None:
        pytest.skip(why)
    from coordd.store.postgres import throwaway
    cluster = throwaway.Cluster()
    try:
        dsn = cluster.start()
    except RuntimeError as exc:
        cluster.stop()
        pytest.skip(f"could not start a throwaway PostgreSQL cluster: {exc}")
    yield dsn
    cluster.stop()
