"""One name check for everything coordd accepts: no control or bidi-override characters."""

from __future__ import annotations

import logging

import pytest

from coordd import errors
from coordd.process_start import LineFormatter
from coordd.rules.names import check_id, check_name
from coordd.wire.protocol import (
    AgentStatusUpdate, Claim, Empty, Enqueue, Heartbeat, SendMessage,
)
from coordd.wire.workflows import ListWorkflows, ScheduleAdd
from tests.unit.test_workflows import _convert

BAD = ["a\nb", "a\rb", "\x1b[2J", "a\x00", "a\x7f", "a\x85b", "a\x9bb", "a\u202eb",
       "a\u2066b", "a\u2069", "a\u2028b"]
GOOD = ["gpu-0", "résumé", "名前", "a b", "a\u200db"]  # not controls: accepted


def _graph(**over):
    node = {"name": "n", "kind": "k", "required_role": "cpu"}
    node.update({k: v for k, v in over.items() if k != "wf"})
    return _convert({"name": over.get("wf", "w"), "nodes": [node]})


CALLS = {
    "heartbeat worker_id": lambda c, v: c.heartbeat(Heartbeat(worker_id=v, roles=["cpu"],
                                                               readings={})),
    "heartbeat role": lambda c, v: c.heartbeat(Heartbeat(worker_id="w", roles=[v],
                                                          readings={})),
    "claim worker_id": lambda c, v: c.claim(Claim(worker_id=v, lease_s=30)),
    "claim claim_id": lambda c, v: c.claim(Claim(worker_id="w", lease_s=30, claim_id=v)),
    "enqueue kind": lambda c, v: c.enqueue(Enqueue(kind=v, required_role="cpu", priority=2)),
    "enqueue role": lambda c, v: c.enqueue(Enqueue(kind="k", required_role=v, priority=2)),
    "enqueue key": lambda c, v: c.enqueue(Enqueue(kind="k", required_role="cpu", priority=2,
                                                  idempotency_key=v)),
    "workflow name": lambda c, v: c.workflow_submit(_graph(wf=v)),
    "node name": lambda c, v: c.workflow_submit(_graph(name=v)),
    "node kind": lambda c, v: c.workflow_submit(_graph(kind=v)),
    "node role": lambda c, v: c.workflow_submit(_graph(required_role=v)),
    "schedule name": lambda c, v: c.schedule_add(ScheduleAdd(name=v, cron="* * * * *",
                                                             workflow=_graph())),
    "message sender": lambda c, v: c.send_message(SendMessage(sender=v, recipient="r",
                                                              content="x")),
    "agent name": lambda c, v: c.update_agent_status(AgentStatusUpdate(name=v, status="ok")),
}


@pytest.mark.parametrize("where", list(CALLS))
async def test_control_and_bidi_characters_refused_in_every_name(bundle, where):
    for value in BAD:
        with pytest.raises(errors.BadRequest, match="control or bidi-override characters"):
            await CALLS[where](bundle.coord, value)
    st = await bundle.coord.status()
    assert sum(st.jobs.values()) == 0 and st.workers == 0
    assert (await bundle.coord.workflow_list(ListWorkflows())).workflows == []
    assert (await bundle.coord.schedule_list(Empty())).schedules == []


def test_check_name_accepts_ordinary_unicode_and_names_the_character():
    for value in GOOD:
        check_name("x", value)
    with pytest.raises(errors.BadRequest, match=r"U\+202E at position 1"):
        check_name("node name", "a\u202eb")


@pytest.mark.parametrize("code", range(128))
def test_check_id_refuses_exactly_the_ascii_controls(code):
    # check_id passes printable ASCII without its regex: the same answer for every
    # ASCII character, alone and inside an id
    for value in (chr(code), f"job-{chr(code)}-1"):
        if 0x20 <= code < 0x7f:
            check_id("job_id", value)
        else:
            with pytest.raises(errors.BadRequest, match=f"U\\+{code:04X} at position"):
                check_id("job_id", value)


def test_plain_log_lines_stay_one_line():
    rec = logging.LogRecord("coordd", logging.INFO, __file__, 1, "refused %s", ("a\nFAKE\u202e",),
                            None)
    line = LineFormatter("%(levelname)s %(message)s").format(rec)
    assert line == "INFO refused a\\nFAKE\\u202e"
