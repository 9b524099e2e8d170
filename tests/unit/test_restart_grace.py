"""The restart grace (issue 18): after coordd starts, a lease still stored runs one more of
its lease periods before the reaper may take it, so a worker that reconnects and renews
keeps its job; a worker that does not renew loses it one period later. FakeClock."""

from __future__ import annotations

import random

from coordd import config as config_mod
from coordd.clock import FakeClock
from coordd.wire.protocol import GetJob, Heartbeat, Renew
from coordd.daemon.server import sqlite_coordinator
from coordd.service import Coordinator
from tests.conftest import COOL


async def _coord(path: str, clock: FakeClock) -> Coordinator:
    coord = sqlite_coordinator(path, config_mod.load(None), clock, rng=random.Random(7))
    await coord.start()
    return coord


async def test_leases_get_one_lease_period_after_a_restart(bundle, tmp_path):
    b = bundle
    for w in ("wa", "wb"):
        await b.worker(w)
    for _ in range(2):
        await b.enqueue()
    b.clock.set(102.0)
    leases = {w: await b.claim(w, lease_s=45) for w in ("wa", "wb")}  # both expire at 147
    await b.coord.close()  # coordd stops; it comes back at t=200, past both expiries
    clock = FakeClock(200.0)
    coord = await _coord(b.db_path, clock)
    try:
        assert await coord.store.restart_grace() == 2
        assert (await coord.reap()).reaped == 0  # without the grace: both reaped here
        clock.advance(40)  # t=240: wa reconnects and renews; wb never comes back
        await coord.heartbeat(Heartbeat(worker_id="wa", roles=["cpu"], readings=COOL))
        a = leases["wa"]
        r = await coord.renew(Renew(job_id=a.job.job_id, worker_id="wa", token=a.lease.token,
                                    lease_s=45))
        assert r.lease_s == 45
        assert (await coord.reap()).reaped == 0
        clock.advance(6)  # t=246: wb's lease (200 + 45) has ended; wa's runs to 285
        assert (await coord.reap()).reaped == 1
        status = {w: (await coord.get_job(GetJob(job_id=leases[w].job.job_id))).status
                  for w in leases}
        assert status == {"wa": "running", "wb": "waiting"}
    finally:
        await coord.close()
