"""Schedules over both stores (coordd.store.api_schedules): add (created, unchanged,
replaced, refused), list, remove, and the tick's start of due slots, once per slot even
when two ticks run at once; the same answers from SQLite and PostgreSQL, `now` pinned."""

from __future__ import annotations

import asyncio
import json

import pytest

from coordd import errors
from coordd.ids import JobIds
from coordd.store.api_workflows import NewNode, NewWorkflow
from coordd.service.workflows import cron_after, due_slots

T = 1_700_000_040.0  # a minute's start (cron slots are minutes)
EVERY_MINUTE, HOURLY = "* * * * *", "0 * * * *"


def spec(name: str = "nightly", **kw) -> str:
    return json.dumps({"name": name, "nodes": [{"name": "a", "kind": "k",
                                                "required_role": "cpu"}], **kw})


def planner(ids: JobIds):
    """The slot's workflow as coordd.service.workflows.Workflows._plan_slot makes it (one node)."""
    def plan(spec_json: str, schedule_id: str, slot: float) -> NewWorkflow:
        s = json.loads(spec_json)
        if s.get("broken"):
            raise errors.BadRequest("the template no longer validates")
        return NewWorkflow(
            workflow_id=ids.new(slot), name=s["name"], schedule_id=schedule_id,
            idempotency_key=f"schedule:{schedule_id}:{slot:.0f}",
            nodes=[NewNode(job_id=ids.new(slot), name="a", kind="k", required_role="cpu",
                           priority=2, payload={}, max_attempts=1)])
    return plan


async def add(b, name="nightly", cron=EVERY_MINUTE, sid=None, replace=False, now=T, **kw):
    return await b.store.schedule_add(sid or f"id-{name}", name, cron, spec(name, **kw),
                                      cron_after(cron, now), replace, now=now)


async def test_add_list_replace_and_remove(bundle):
    b = bundle
    assert await b.store.schedule_list() == []
    assert await add(b) == "created"
    assert await add(b, sid="other-id") == "unchanged"  # a repeated add
    with pytest.raises(errors.InvalidState, match="different cron"):
        await add(b, cron=HOURLY)
    with pytest.raises(errors.InvalidState, match="different workflow"):
        await add(b, extra=1)
    assert await add(b, "b-first", HOURLY) == "created"
    assert [(v.schedule_id, v.name, v.cron, v.workflow, v.next_at, v.last_slot, v.fired)
            for v in await b.store.schedule_list()] == [
        ("id-b-first", "b-first", HOURLY, "b-first", cron_after(HOURLY, T), None, 0),
        ("id-nightly", "nightly", EVERY_MINUTE, "nightly", T + 60, None, 0)]
    assert await add(b, extra=1, replace=True, now=T + 30) == "replaced"  # same cron: slot kept
    assert (await b.store.schedule_list())[1].next_at == T + 60
    assert await add(b, cron=HOURLY, replace=True, now=T + 30) == "replaced"
    kept = (await b.store.schedule_list())[1]
    assert (kept.schedule_id, kept.cron, kept.next_at) == ("id-nightly", HOURLY,
                                                            cron_after(HOURLY, T + 30))
    assert await b.store.schedule_remove("nightly") is True
    assert await b.store.schedule_remove("id-b-first") is True  # by id too
    assert await b.store.schedule_remove("nightly") is False
    assert await b.store.schedule_list() == []


async def test_a_due_slot_starts_one_workflow_and_the_schedule_advances(bundle):
    b = bundle
    plan = planner(JobIds())
    await add(b)
    assert await b.store.schedule_fire_due(due_slots, plan, now=T + 59) == []
    fired = await b.store.schedule_fire_due(due_slots, plan, now=T + 60)
    assert [(n, s, p, e) for n, s, _, p, e in fired] == [("nightly", T + 60, 0, None)]
    wid = fired[0][2]
    view = await b.store.workflow_get(wid)
    assert (view.name, view.schedule_id, view.idempotency_key) == (
        "nightly", "id-nightly", f"schedule:id-nightly:{T + 60:.0f}")
    assert await b.store.schedule_fire_due(due_slots, plan, now=T + 61) == []
    (v,) = await b.store.schedule_list()
    assert (v.next_at, v.last_slot, v.fired) == (T + 120, T + 60, 1)
    late = await b.store.schedule_fire_due(due_slots, plan, now=T + 300 + 5)  # 3 missed
    assert [(s, p) for _, s, _, p, _ in late] == [(T + 300, 3)]


async def test_a_broken_template_passes_its_slot_and_holds_no_other_up(bundle):
    b = bundle
    plan = planner(JobIds())
    await add(b, "broken", broken=True)
    await add(b, "fine")
    fired = sorted(await b.store.schedule_fire_due(due_slots, plan, now=T + 60))
    assert [(n, w is None, e) for n, _, w, _, e in fired] == [
        ("broken", True, "the template no longer validates"), ("fine", False, None)]
    assert [v.fired for v in await b.store.schedule_list()] == [1, 1]


async def test_two_ticks_at_once_start_a_slot_once(bundle):
    b = bundle
    plan = planner(JobIds())
    for i in range(5):
        await add(b, f"s{i}")
    runs = await asyncio.gather(*(b.store.schedule_fire_due(due_slots, plan, now=T + 60)
                                  for _ in range(3)))
    started = [w for fired in runs for _, _, w, _, _ in fired if w is not None]
    assert len(started) == 5
    assert sum(v.fired for v in await b.store.schedule_list()) == 5
