"""Admission on a real coordd over the PostgreSQL store (issue 20): the config's
`[limits]` honoured by claims, the limits RPC methods over the socket (a runtime override
kept over a restart), an unknown limit refused `bad_request`, usage counted against a
budget, a result schema enforced. Skipped, with the reason, without asyncpg or the
PostgreSQL binaries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from coordd import errors
from coordd.client import Client
from tests.integration.test_pg_daemon import DAEMON_CFG, Coordd, pg_db  # noqa: F401
from tests.integration.workerbench import COOL

LIMITS_CFG = """
[limits.gpu]
concurrency = 1

[limits.llm]
budget = { tokens = "100/h" }
"""


@pytest.fixture
def coordd_pg(pg_db: str, tmp_path: Path) -> Any:  # noqa: F811
    cfg = tmp_path / "coordd.toml"
    cfg.write_text(DAEMON_CFG + LIMITS_CFG)
    made: list[Coordd] = []

    def start() -> Coordd:
        d = Coordd(pg_db, str(tmp_path / "c.sock"), str(cfg), tmp_path / "c.log").start()
        made.append(d)
        return d
    yield start
    for d in made:
        d.stop()


async def test_limits_are_served_and_honoured_on_postgres(coordd_pg):
    d = coordd_pg()
    await d.wait_serving()
    async with Client(d.socket, timeout=10) as c:
        with pytest.raises(errors.BadRequest, match="unknown limit 'nope'"):
            await c.enqueue(kind="m", required_role="cpu", priority=1, payload={},
                            limits=["nope"])
        gpu_jobs = [(await c.enqueue(kind="m", required_role="cpu", priority=1, payload={},
                                     limits=["gpu"])).job_id for _ in range(2)]
        for w in ("w1", "w2"):
            await c.heartbeat(w, ["cpu"], COOL)
        got = await c.claim("w1")
        refused = await c.claim("w2")
        assert got.job is not None and refused.job is None and refused.reasons == ["limit"]
        view = (await c.limits("gpu")).limits[0]
        assert view.used == 1 and view.holders[0].job_id == got.job.job_id
        shown = await c.get_job(gpu_jobs[1])  # coordctl show: its limits, the full one
        assert [u.name for u in shown.limits] == ["gpu"]
        assert shown.waiting_reason.startswith("limit gpu: 1/1 running")
        assert (await c.limits_set("gpu", {"concurrency": 2})).concurrency == 2
        assert (await c.claim("w2")).job is not None  # the override is honoured at once
        with pytest.raises(errors.NotFound, match="no limit 'x'"):
            await c.limits("x")
        # usage against a budget, over the socket
        await c.enqueue(kind="m", required_role="cpu", priority=1, payload={}, limits=["llm"])
        await c.enqueue(kind="m", required_role="cpu", priority=1, payload={}, limits=["llm"])
        spent = await c.claim("w1")
        await c.complete(spent.job.job_id, "w1", spent.lease.token, "ok", usage={"tokens": 500})
        assert (await c.claim("w1")).reasons == ["limit"]
        assert (await c.limits("llm")).limits[0].budget_used == {"tokens": 500.0}
        # a result schema: a bad result spends the attempt, with the schema's error
        job = (await c.enqueue(kind="m", required_role="cpu", priority=0, payload={},
                               result_schema="claims")).job_id
        held = await c.claim("w1")
        assert held.job.job_id == job
        bad = await c.complete(job, "w1", held.lease.token, {"claims": [{"text": "x"}]})
        assert bad.status == "waiting" and bad.error.startswith("result_invalid (claims)")
    d.stop()
    d = coordd_pg()  # the runtime override is kept in the database
    await d.wait_serving()
    async with Client(d.socket, timeout=10) as c:
        view = (await c.limits("gpu")).limits[0]
        assert view.source == "config+runtime" and view.concurrency == 2 and view.used == 2
        await c.limits_reset("gpu")
        assert (await c.limits("gpu")).limits[0].concurrency == 1
