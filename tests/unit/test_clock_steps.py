"""Wall-clock steps while coordd runs (issue 14, bug 9): a step either way (NTP, a manual
change) neither stretches nor shrinks leases, heartbeat staleness, backoff, hub ttl and
visibility timeouts; coordd's clock runs on the monotonic clock and takes the step in the
writer, together with the stored times. FakeClock.jump_wall moves only the wall clock."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.clock import AnchoredClock, FakeClock
from coordd.wire.protocol import Fail, ReadMessages, Renew, SendMessage

# forward below clock_jump_s (an NTP step, no suspend grace), and back, small and large
STEPS = [45.0, -45.0, -600.0, -86400.0]


async def _claimed(b, lease_s: float = 30.0):
    await b.worker("w1")
    job = await b.enqueue()
    c = await b.claim("w1", lease_s=lease_s)
    assert c.job is not None and c.job.job_id == job
    return job, c


def test_anchored_clock_ignores_wall_steps_until_shifted():
    base = FakeClock(1000.0)
    clock = AnchoredClock(base)
    base.jump_wall(-600)
    base.advance(10)
    assert clock.wall() == 1010.0 and clock.step() == -600.0
    clock.shift(clock.step())
    assert clock.wall() == base.wall() == 410.0 and clock.step() == 0.0


@pytest.mark.parametrize("step", STEPS)
async def test_lease_ends_after_its_length_in_real_time(bundle, step):
    job, c = await _claimed(bundle)
    bundle.clock.jump_wall(step)
    bundle.clock.advance(29)
    assert (await bundle.coord.reap()).reaped == 0, "a step shrank the lease"
    r = await bundle.coord.renew(Renew(job_id=job, worker_id="w1", token=c.lease.token,
                                       lease_s=30))
    assert r.expires_at == bundle.clock.wall() + 30  # coordd took the step
    bundle.clock.advance(29)
    assert (await bundle.coord.reap()).reaped == 0
    bundle.clock.advance(2)
    assert (await bundle.coord.reap()).reaped == 1, "a step stretched the lease"


@pytest.mark.parametrize("step", STEPS)
async def test_lease_not_renewed_expires_on_time(bundle, step):
    job, c = await _claimed(bundle)
    bundle.clock.advance(10)
    await bundle.worker("w1")  # a batch before the step
    bundle.clock.jump_wall(step)
    bundle.clock.advance(21)
    with pytest.raises(errors.LeaseExpired):
        await bundle.coord.renew(Renew(job_id=job, worker_id="w1", token=c.lease.token))


@pytest.mark.parametrize("step", STEPS)
async def test_heartbeat_staleness_keeps_its_length(bundle, step):
    await bundle.worker("w1")
    first, second = await bundle.enqueue(), await bundle.enqueue()
    bundle.clock.jump_wall(step)
    bundle.clock.advance(29)
    got = await bundle.claim("w1")
    assert got.job is not None and got.job.job_id == first, got.reasons
    bundle.clock.advance(2)  # 31 s since the heartbeat (heartbeat_stale_s = 30)
    res = await bundle.claim("w1")
    assert res.job is None and "heartbeat_stale" in res.reasons, res.reasons
    await bundle.worker("w1")
    assert (await bundle.claim("w1")).job.job_id == second


@pytest.mark.parametrize("step", STEPS)
async def test_backoff_keeps_its_length(bundle, step):
    job, c = await _claimed(bundle)
    r = await bundle.coord.fail(Fail(job_id=job, worker_id="w1", token=c.lease.token,
                                     error="flaky", retryable=True))
    delay = r.run_at - bundle.clock.wall()
    assert delay >= 5
    bundle.clock.jump_wall(step)
    bundle.clock.advance(delay - 1)
    await bundle.worker("w1")
    assert (await bundle.claim("w1")).job is None, "a step shortened the backoff"
    bundle.clock.advance(2)
    await bundle.worker("w1")
    got = await bundle.claim("w1")
    assert got.job is not None and got.job.job_id == job, "a step lengthened the backoff"


@pytest.mark.parametrize("step", [-600.0, -86400.0])
async def test_a_due_job_stays_due_after_a_step_back(bundle, step):
    await bundle.worker("w1")
    job = await bundle.enqueue()
    bundle.clock.advance(1)
    bundle.clock.jump_wall(step)
    await bundle.worker("w1")
    got = await bundle.claim("w1")
    assert got.job is not None and got.job.job_id == job


async def test_a_client_run_at_is_a_calendar_time(bundle):
    """A run_at the client sent is a time of day: after a +45 s step it comes 45 s sooner."""
    await bundle.worker("w1")
    job = await bundle.enqueue(run_at=bundle.clock.wall() + 100)
    bundle.clock.jump_wall(45)
    bundle.clock.advance(54)
    await bundle.worker("w1")
    assert (await bundle.claim("w1")).job is None
    bundle.clock.advance(2)
    await bundle.worker("w1")
    assert (await bundle.claim("w1")).job.job_id == job


@pytest.mark.parametrize("step", [45.0, -600.0])
async def test_message_ttl_and_visibility_keep_their_length(bundle, step):
    hub = bundle.coord
    await hub.send_message(SendMessage(sender="a", recipient="b", content="ttl", ttl_s=30))
    await hub.send_message(SendMessage(sender="a", recipient="b", content="seen"))
    first = await hub.read_messages(ReadMessages(reader="b", visibility_s=60, limit=1))
    assert [m.content for m in first.messages] == ["ttl"]  # P2 both: oldest first
    first = await hub.read_messages(ReadMessages(reader="b", visibility_s=60, limit=1))
    assert [m.content for m in first.messages] == ["seen"]
    bundle.clock.jump_wall(step)
    bundle.clock.advance(29)
    again = await hub.read_messages(ReadMessages(reader="b", visibility_s=60))
    assert again.messages == [], "a step shortened the visibility timeout"
    bundle.clock.advance(32)  # 61 s: "seen" is visible again; "ttl" expired at 30 s
    again = await hub.read_messages(ReadMessages(reader="b", visibility_s=60))
    assert [m.content for m in again.messages] == ["seen"]


async def test_readers_see_the_old_clock_until_the_writer_takes_the_step(bundle):
    await bundle.worker("w1")
    before = bundle.coord.clock.wall()
    bundle.clock.jump_wall(-600)
    assert bundle.coord.clock.wall() == before  # nothing moved yet: clock and rows agree
    await bundle.worker("w1")
    assert bundle.coord.clock.wall() == bundle.clock.wall()
    view = (await bundle.coord.workers()).workers[0]
    assert view.heartbeat_age_s == 0.0
