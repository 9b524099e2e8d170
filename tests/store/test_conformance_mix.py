"""Areas together over both stores: fleet limits with preemption, workflows, goodbyes and
the reaper, and concurrent claimers on a mix of jobs. The same bodies on SQLite and
PostgreSQL."""

from __future__ import annotations

from coordd import limits
from tests.store.conftest import COOL, T0
from tests.store.test_conformance_governance import FULL, beat, gov
from tests.store.test_conformance_limits import book, policy, ref


async def test_a_reserved_claim_holds_the_limit_units_of_the_job_it_takes(bundle):
    """A P0 asking a limit's unit preempts the P3 holding it; the reserved claim that takes
    the P0 holds its unit, so the limit stays within its concurrency."""
    lb = book(gpu={"concurrency": 1})
    bundle.policy = policy(lb)
    g = gov()
    p3 = await bundle.enqueue(priority=3, limits=[("gpu", 1)])
    await beat(bundle, g, "a", T0, {**COOL, **FULL})
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    assert got.job.job_id == p3
    p0 = await bundle.enqueue(now=T0 + 20, priority=0, limits=[("gpu", 1)])
    other = await bundle.enqueue(now=T0 + 20, priority=1, limits=[("gpu", 1)])
    assert (await beat(bundle, g, "a", T0 + 40, {**COOL, **FULL})).preempted == [(p0, p3, "a")]
    await bundle.store.release(ref(got, "a"), "vacated", now=T0 + 43)
    taken = await bundle.claim("a", now=T0 + 44, lease_s=300.0)
    assert taken.job.job_id == p0
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 44)
    assert views[0].used == 1 and [h.job_id for h in views[0].holders] == [p0]
    await bundle.worker("b", now=T0 + 44)
    refused = await bundle.claim("b", now=T0 + 45)
    assert refused.job is None and refused.reasons == [limits.LIMIT_REFUSED], other


async def test_a_reserved_job_waits_while_its_limit_is_full(bundle):
    """The reservation promises the victim's slot, not a unit someone else holds: while
    the P0's limit is full the reserved claim does not take it."""
    lb = book(gpu={"concurrency": 1})
    bundle.policy = policy(lb)
    g = gov()
    await bundle.worker("z", now=T0)
    held = await bundle.enqueue(priority=2, limits=[("gpu", 1)])
    assert (await bundle.claim("z", now=T0, lease_s=300.0)).job.job_id == held
    p3 = await bundle.enqueue(now=T0 + 1, priority=3)
    await beat(bundle, g, "a", T0 + 1, {**COOL, **FULL})
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    assert got.job.job_id == p3
    p0 = await bundle.enqueue(now=T0 + 20, priority=0, limits=[("gpu", 1)])
    hb = await beat(bundle, g, "a", T0 + 40, {**COOL, **FULL})
    if not hb.preempted:  # a store that sees the limit is full need not preempt at all
        return
    assert hb.preempted == [(p0, p3, "a")]
    await bundle.store.release(ref(got, "a"), "vacated", now=T0 + 43)
    refused = await bundle.claim("a", now=T0 + 44, lease_s=300.0)
    assert refused.job is None or refused.job.job_id != p0
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 44)
    assert views[0].used == 1 and [h.job_id for h in views[0].holders] == [held]
