"""Schedules (issue 8) on a pinned clock: each cron slot starts its workflow once, across a
restart and even if the schedule's advance were lost; a bad cron is refused; a template
that no longer validates does not hold up the round. No sleeps: time moves with FakeClock.
The graphs themselves are tests/unit/test_workflows.py."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.clock import FakeClock
from coordd.wire.protocol import Empty
from coordd.wire.workflows import ListWorkflows, ScheduleAdd, ScheduleName
from tests.unit.test_workflows import _convert, open_coord


async def test_schedule_enqueues_each_slot_once_across_restart(tmp_path):
    path = str(tmp_path / "sched.db")
    clock = FakeClock(600.0)  # 00:10:00 UTC, 1 Jan 1970
    coord = await open_coord(path, clock)
    one = {"name": "nightly", "nodes": [{"name": "n", "kind": "k", "required_role": "cpu"}]}
    added = await coord.schedule_add(ScheduleAdd(name="every5", cron="*/5 * * * *",
                                                 workflow=_convert(one)))
    assert added.created and added.next_at == 900.0
    again = await coord.schedule_add(ScheduleAdd(name="every5", cron="*/5 * * * *",
                                                 workflow=_convert(one)))
    assert not again.created and again.schedule_id == added.schedule_id
    assert (await coord.flows.tick())[2] == 0
    clock.set(900.0)
    assert (await coord.flows.tick())[2] == 1
    assert (await coord.flows.tick())[2] == 0  # same slot, same round of time: nothing
    await coord.close()  # restart at the same moment: the slot is not started again
    coord = await open_coord(path, clock)
    assert (await coord.flows.tick())[2] == 0
    clock.set(1199.0)
    assert (await coord.flows.tick())[2] == 0
    clock.set(1200.0)
    assert (await coord.flows.tick())[2] == 1
    await coord.close()
    # down from 1200 to 2150: slots 1500, 1800, 2100 missed -> the latest (2100) runs once
    clock.set(2150.0)
    coord = await open_coord(path, clock)
    assert (await coord.flows.tick())[2] == 1
    assert (await coord.flows.tick())[2] == 0
    sched = (await coord.schedule_list(Empty())).schedules[0]
    assert (sched.fired, sched.last_slot, sched.next_at) == (3, 2100.0, 2400.0)
    wfs = (await coord.workflow_list(ListWorkflows())).workflows
    assert sorted(w.idempotency_key for w in wfs) == [
        f"schedule:{sched.schedule_id}:{s}" for s in (1200, 2100, 900)]
    assert all(w.schedule_id == sched.schedule_id for w in wfs)
    await coord.schedule_remove(ScheduleName(name="every5"))
    assert (await coord.schedule_list(Empty())).schedules == []
    with pytest.raises(errors.NotFound):
        await coord.schedule_remove(ScheduleName(name="every5"))
    await coord.close()


async def test_bad_cron_refused(bundle):
    one = {"name": "x", "nodes": [{"name": "n", "kind": "k", "required_role": "cpu"}]}
    with pytest.raises(errors.BadRequest, match="cron"):
        await bundle.coord.schedule_add(ScheduleAdd(name="s", cron="61 * * * *",
                                                    workflow=_convert(one)))


async def test_schedule_slot_key_holds_even_if_the_advance_were_lost(tmp_path):
    """The idempotency key `schedule:<id>:<slot>` is the second guard: put next_at back
    by hand (as if the advance had been lost) and the slot still starts only once."""
    path = str(tmp_path / "s.db")
    clock = FakeClock(590.0)
    coord = await open_coord(path, clock)
    one = {"name": "w", "nodes": [{"name": "n", "kind": "k", "required_role": "cpu"}]}
    await coord.schedule_add(ScheduleAdd(name="m", cron="* * * * *", workflow=_convert(one)))
    clock.set(600.0)
    assert (await coord.flows.tick())[2] == 1
    await coord.store.writer.run(lambda conn, now: conn.execute(
        "UPDATE schedules SET next_at = 600.0"))
    assert (await coord.flows.tick())[2] == 0
    assert len((await coord.workflow_list(ListWorkflows())).workflows) == 1
    assert (await coord.status()).jobs["waiting"] == 1
    await coord.close()


async def test_schedule_whose_template_broke_does_not_block_the_round(tmp_path):
    path = str(tmp_path / "b.db")
    clock = FakeClock(590.0)
    coord = await open_coord(path, clock)
    one = {"name": "w", "nodes": [{"name": "n", "kind": "k", "required_role": "cpu"}]}
    await coord.schedule_add(ScheduleAdd(name="m", cron="* * * * *", workflow=_convert(one)))
    await coord.store.writer.run(lambda conn, now: conn.execute(  # e.g. a schema since removed
        "UPDATE schedules SET spec_json = json_set(spec_json, '$.nodes[0].result_schema', "
        "'gone')"))
    clock.set(600.0)
    assert (await coord.flows.tick())[2] == 0
    sched = (await coord.schedule_list(Empty())).schedules[0]
    assert sched.next_at == 660.0  # the slot passed; the next one is due as usual
    await coord.close()
