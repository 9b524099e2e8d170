"""The limits' release trigger (coordd.store.limits) runs only while units may be held:
dropped at start when no limit is defined and no unit is held (a lease delete then runs
no trigger program), created again by a limit defined at runtime before any claim can
take a unit, and kept over a restart while units are held, so every lease end still
releases its units."""

from __future__ import annotations

import random

from coordd import config as config_mod
from coordd.clock import FakeClock
from coordd.wire.protocol import Complete
from coordd.wire.limits import LimitSet
from coordd.daemon.server import sqlite_coordinator
from tests.conftest import T0, Bundle

TRIGGER = ("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' "
           "AND name = 'limit_holds_release'")


async def trigger_exists(b: Bundle) -> bool:
    return bool(await b.coord.store.readers.run(lambda conn: conn.execute(TRIGGER).fetchone()[0]))


async def holds(b: Bundle) -> int:
    return await b.coord.store.readers.run(lambda conn: conn.execute(
        "SELECT count(*) FROM limit_holds").fetchone()[0])


async def test_no_limit_no_trigger_program_on_a_lease_end(bundle):
    assert not await trigger_exists(bundle)
    await bundle.worker("w")
    job_id = await bundle.enqueue()
    got = await bundle.claim("w")
    traced: list[str] = []
    bundle.coord.store.writer._conn.set_trace_callback(traced.append)
    try:
        await bundle.coord.complete(Complete(job_id=job_id, worker_id="w",
                                             token=got.lease.token, result={}))
    finally:
        bundle.coord.store.writer._conn.set_trace_callback(None)
    deletes = [s for s in traced if s.startswith("DELETE FROM leases")]
    assert len(deletes) == 1, deletes  # SQLite traces it again for each trigger program


async def test_a_limit_set_at_runtime_brings_the_trigger_and_units_are_released(bundle):
    assert not await trigger_exists(bundle)
    await bundle.coord.limits_set(LimitSet(name="api", settings={"concurrency": 2}))
    assert await trigger_exists(bundle)
    await bundle.worker("w")
    job_id = await bundle.enqueue(limits=["api"])
    got = await bundle.claim("w")
    assert got.job is not None and await holds(bundle) == 1
    await bundle.coord.complete(Complete(job_id=job_id, worker_id="w", token=got.lease.token,
                                         result={}))
    assert await holds(bundle) == 0


async def test_held_units_keep_the_trigger_over_a_restart_without_limits(make_bundle):
    b = await make_bundle(limits={"api": {"concurrency": 2}})
    assert await trigger_exists(b)
    await b.worker("w")
    job_id = await b.enqueue(limits=["api"])
    got = await b.claim("w")
    assert await holds(b) == 1
    await b.coord.close()
    # the limit is gone from the config, the unit is still held: the trigger stays
    again = sqlite_coordinator(b.db_path, config_mod.load(None), FakeClock(T0),
                               rng=random.Random(1))
    await again.start()
    try:
        b2 = Bundle(again, b.clock, b.db_path)
        assert await trigger_exists(b2)
        await again.complete(Complete(job_id=job_id, worker_id="w", token=got.lease.token,
                                      result={}))
        assert await holds(b2) == 0
    finally:
        await again.close()
    # nothing held and no limit: the next start drops it
    third = sqlite_coordinator(b.db_path, config_mod.load(None), FakeClock(T0),
                               rng=random.Random(2))
    await third.start()
    try:
        assert not await trigger_exists(Bundle(third, b.clock, b.db_path))
    finally:
        await third.close()
