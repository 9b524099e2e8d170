"""Claims against a brute-force reference model: random waiting jobs (priorities P0..P3,
roles, kinds, run_at in the past or future, gate overrides that refuse, allow or do not
decode), random workers (roles, kinds filter, readings refusing P3). Each claim must take
exactly the job the model picks by walking every waiting job in claim order, look at no
more than CLAIM_SCAN candidates per level, dead-letter exactly the undecodable ones it
looked at, and report the model's refusal reasons when nothing is claimable. The claim
walks one cursor per (role, kind) pair and merges them: priority order across kinds and
roles must come out exactly as one walk of every waiting job would give it."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from coordd import store
from coordd.rules import gates
from coordd.jsontext import lenient_json

ROLES = ("cpu", "gpu", "tpu")
KINDS = ("a", "b", "c", "d")
# what a worker names: any kind, one, several (in any order, repeated), one nobody enqueued
KIND_FILTERS = (None, None, ["a"], ["b"], ["a", "b"], ["d", "b", "c"], ["c", "c"], ["z"],
                ["a", "z"], [])
GATES = (None, None, None, {"max_temperature_c": 10.0}, {"max_temperature_c": 99.0},
         {"min_user_idle_s": None, "require_mains": False}, {"max_memory_pct": 5.0}, "BAD")


def model(jobs: list[tuple], now: float, roles: list[str], kinds: list[str] | None,
          readings: dict[str, Any], policies: dict[int, Any]
          ) -> tuple[str | None, set[str], set[str]]:
    """(job taken, undecodable jobs looked at, refusal codes) by brute force."""
    cands = sorted((j for j in jobs if j[5] <= now and j[2] in roles
                    and (kinds is None or j[3] in kinds)), key=lambda j: (j[1], j[4], j[0]))
    undecodable: set[str] = set()
    reasons: set[str] = set()
    for prio in range(4):
        for job_id, _p, _r, _k, _q, _run_at, gates_json in [c for c in cands
                                                              if c[1] == prio][:store.CLAIM_SCAN]:
            policy = policies[prio]
            if gates_json is not None:
                try:
                    policy = gates.merge(policy, msgspec.json.decode(gates_json))
                except (msgspec.ValidationError, msgspec.DecodeError):
                    undecodable.add(job_id)
                    continue
            refusals = gates.evaluate(policy, readings)
            if not refusals:
                return job_id, undecodable, reasons
            reasons.update(code for code, _ in refusals)
    return None, undecodable, reasons


async def waiting(bundle) -> list[tuple]:
    return await bundle.coord.store.readers.run(lambda conn: conn.execute(
        "SELECT job_id, priority, required_role, kind, queued_at, run_at, gates_json "
        "FROM jobs WHERE status = 'waiting'").fetchall())


@pytest.mark.parametrize("seed", range(40))
async def test_claims_match_a_brute_force_model(make_bundle, seed):
    rnd = random.Random(seed)
    b = await make_bundle()
    policies = b.coord._policies
    bad: list[str] = []
    for _ in range(rnd.choice([5, 30, 80, 120])):
        b.clock.advance(rnd.choice([0.0, 0.0, 0.5, 3.0]))
        g = rnd.choice(GATES)
        run_at = rnd.choice([None, None, b.clock.wall() + rnd.choice([1.0, 50.0, 500.0])])
        job = await b.enqueue(priority=rnd.choice([0, 1, 2, 3, 3, 2]),
                              role=rnd.choice(ROLES), kind=rnd.choice(KINDS), run_at=run_at,
                              gates=g if isinstance(g, dict) else None)
        if g == "BAD":
            bad.append(job)
    if bad:  # stored gate overrides that no longer decode (a planted or old row)
        await b.coord.store.writer.run(lambda conn, now: conn.executemany(
            "UPDATE jobs SET gates_json = ? WHERE job_id = ?",
            [(rnd.choice(['{"nope": 1}', "{bad json", '{"max_memory_pct": "x"}']), j)
             for j in bad]))
    for step in range(25):
        roles = rnd.sample(ROLES, rnd.choice([1, 1, 2, 3]))
        kinds = rnd.choice(KIND_FILTERS)
        readings = {"user_idle_s": rnd.choice([1.0, 3600.0, None]),
                    "temperature_c": rnd.choice([50.0, 50.0, 85.0, 95.0]),
                    "on_battery": rnd.choice([False, False, True, None])}
        await b.worker("w", roles=roles, **readings)
        b.clock.advance(rnd.choice([0.0, 1.0, 20.0]))
        await b.worker("w", roles=roles, **readings)  # fresh heartbeat at this time
        hb = await b.coord.store.readers.run(lambda conn: conn.execute(
            "SELECT heartbeat_json FROM workers WHERE worker_id = 'w'").fetchone()[0])
        jobs = await waiting(b)
        want, want_dead, want_reasons = model(jobs, b.clock.wall(), roles, kinds,
                                              lenient_json(hb, {}), policies)
        got = await b.claim("w", kinds=kinds)
        after = {j[0] for j in await waiting(b)}
        dead = {j[0] for j in jobs} - after - ({got.job.job_id} if got.job else set())
        ctx = (seed, step, roles, kinds, readings)
        assert (got.job.job_id if got.job else None) == want, ctx
        assert dead == want_dead, ctx
        if want is None:
            expect = set(want_reasons)
            if not expect and any(j[5] <= b.clock.wall() for j in jobs if j[0] not in dead):
                expect = {gates.NO_MATCHING_ROLE}
            assert set(got.reasons) == expect, (ctx, got.reasons)
