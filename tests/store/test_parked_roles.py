"""A parked claim knows its worker's roles (coordd.service.push, coordd.service.beats), on
both stores: a job of a role none of the parked claims' workers holds wakes none of them,
right after they parked and after their workers' beats were all quiet (answered from
memory, nothing stored) for longer than a maintenance round; a job of their role still
wakes one at once. A Coordinator over each store on a pinned clock; claim looks counted
where the Coordinator calls the store's claim."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordd.rules.gates import NO_MATCHING_ROLE
from coordd.service.reaper import Reaper
from coordd.wire.protocol import Claim, Enqueue, Heartbeat
from tests.store.conftest import COOL
from tests.store.test_conformance_serving import coord  # noqa: F401 - the fixture

N = 12  # parked claims of role cpu
WAIT_S = 300.0  # their wait: the pinned clock never reaches it


def _beat(c: Any, worker_id: str, roles: list[str]) -> Any:
    return c.heartbeat(Heartbeat(worker_id=worker_id, roles=roles, readings=COOL))


def _enqueue(c: Any, role: str, kind: str = "k") -> Any:
    return c.enqueue(Enqueue(kind=kind, required_role=role, priority=3, payload={}))


def _counted_looks(c: Any) -> dict[str, int]:
    """Count each worker's claim looks (every look of a parked claim calls the store)."""
    looks: dict[str, int] = {}
    real = c.store.claim

    async def claim(worker_id: str, *a: Any, **kw: Any) -> Any:
        looks[worker_id] = looks.get(worker_id, 0) + 1
        return await real(worker_id, *a, **kw)
    c.store.claim = claim
    return looks


def _ready_heard(c: Any) -> list[tuple[str, str]]:
    """The (role, kind) of each wake-up push dispatched (on PostgreSQL after its NOTIFY)."""
    heard: list[tuple[str, str]] = []
    real = c.push.job_ready

    def job_ready(role: str, kind: str, n: int = 1) -> None:
        heard.append((role, kind))
        real(role, kind, n)
    c.push.job_ready = job_ready
    return heard


async def _until(cond: Any, what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def _enqueued_and_heard(c: Any, heard: list[tuple[str, str]], role: str) -> str:
    """Enqueue a job of `role`, wait until push has dispatched its wake-up, and give any
    claim it woke the time to look (several turns of the loop and a store round trip)."""
    n = len(heard)
    job = await _enqueue(c, role)
    await _until(lambda: len(heard) > n, f"the wake-up of the {role} job")
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    return job.job_id


def _refused(c: Any) -> float:
    """The claim looks that found only jobs of other roles (the slow test's counter)."""
    return c.meters.registry.get_sample_value(  # type: ignore[no-any-return]
        "coordd_claim_refusals_total", {"reason": NO_MATCHING_ROLE}) or 0.0


@pytest.mark.parametrize("parked_unknown", [False, True], ids=["roles_known", "unknown"])
async def test_a_job_of_another_role_wakes_no_parked_claim(coord, parked_unknown):  # noqa: F811
    """`unknown`: the claims park while their workers' roles are not known (as when a
    claim comes while its worker's full beat is being stored): any job may wake them,
    until their workers' next beats, here all quiet, say the roles."""
    c = coord
    looks, heard = _counted_looks(c), _ready_heard(c)
    # on PostgreSQL, wake-ups flow once its listening session is open: a probe shows it
    await _beat(c, "probe", ["probe"])
    probe = asyncio.ensure_future(c.claim(Claim(worker_id="probe", wait_s=WAIT_S)))
    await _enqueue(c, "probe")
    assert (await asyncio.wait_for(probe, 10)).job is not None
    workers = [f"w{i}" for i in range(N)]
    for w in workers:
        await _beat(c, w, ["cpu"])
    full = c.beats.full
    if parked_unknown:
        roles_of, c.push.roles_of = c.push.roles_of, lambda w: None
    parked = [asyncio.ensure_future(c.claim(Claim(worker_id=w, wait_s=WAIT_S)))
              for w in workers]
    try:
        await _until(lambda: c.push.sleeping == N, "all parked")
        assert all(looks[w] == 1 for w in workers)
        if parked_unknown:
            c.push.roles_of = roles_of
        else:
            await _enqueued_and_heard(c, heard, "gpu")  # right after they parked
            assert {w: n for w, n in looks.items() if w in workers and n > 1} == {}

        refused, stored = _refused(c), []
        touch = c.store.touch_workers

        async def touch_workers(seen: Any, *a: Any, **kw: Any) -> Any:
            stored.append(len(seen))
            return await touch(seen, *a, **kw)
        c.store.touch_workers = touch_workers
        for _ in range(8):  # 16 s of quiet beats, past fresh_s (15 s): two rounds store them
            c.clock.base.advance(2.0)
            quiet = c.beats.quiet
            for w in workers:
                await _beat(c, w, ["cpu"])
            assert c.beats.quiet == quiet + N
            await Reaper(c, c.clock).round()  # stores the quiet beats' times when due
        assert c.beats.full == full  # every beat after the first was quiet
        assert len(stored) >= 2 and all(n == N for n in stored)  # their times, by rounds
        await _enqueued_and_heard(c, heard, "gpu")
        assert {w: n for w, n in looks.items() if w in workers and n > 1} == {}
        assert _refused(c) == refused and c.push.sleeping == N

        job = await _enqueued_and_heard(c, heard, "cpu")  # its role: the oldest takes it
        got = await asyncio.wait_for(parked[0], 5)
        assert got.job is not None and got.job.job_id == job
        assert looks["w0"] == 2 and sum(looks[w] for w in workers) == N + 1
        assert c.push.sleeping == N - 1
    finally:
        for t in parked:
            t.cancel()
        await asyncio.gather(*parked, return_exceptions=True)
