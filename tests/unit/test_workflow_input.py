"""What workflow and schedule requests may carry: refused with bad_request, nothing stored."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.protocol import Empty
from coordd.protocol_workflows import ScheduleAdd
from tests.unit.test_workflows import _convert

ONE = {"name": "w", "nodes": [{"name": "n", "kind": "k", "required_role": "cpu"}]}


@pytest.mark.parametrize("cron", [
    "* * * * * *",          # cronsim reads a sixth field as seconds: a slot every second
    "0 0 * * * *",
    "* * * *",
    "@daily",               # an alias: one field
    "",
    "   ",
    "*/5 * * * * 2030",
])
async def test_cron_needs_exactly_five_fields(bundle, cron):
    with pytest.raises(errors.BadRequest, match="5 fields"):
        await bundle.coord.schedule_add(ScheduleAdd(name="s", cron=cron,
                                                    workflow=_convert(ONE)))
    assert (await bundle.coord.schedule_list(Empty())).schedules == []


async def test_cron_is_stored_without_surrounding_space(bundle):
    added = await bundle.coord.schedule_add(ScheduleAdd(name="s", cron="  */5 * * * *\n",
                                                        workflow=_convert(ONE)))
    assert added.created and added.cron == "*/5 * * * *"
    listed = (await bundle.coord.schedule_list(Empty())).schedules
    assert [s.cron for s in listed] == ["*/5 * * * *"]
