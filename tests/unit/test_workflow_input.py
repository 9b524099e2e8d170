"""What workflow and schedule requests may carry: refused with bad_request, nothing stored."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.wire.protocol import Empty
from coordd.wire.workflows import ScheduleAdd
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


@pytest.mark.parametrize("text,key", [
    ('name = "w"\n[[nodes]]\nname = "a"\nkind = "k"\nrequired_role = "cpu"\n'
     '[[nodes]]\nname = "b"\nkind = "k"\nrequired_role = "cpu"\nneed = ["a"]\n', "need"),
    ('name = "w"\n[[nodes]]\nname = "a"\nkind = "k"\nrequired_role = "cpu"\n'
     'resultschema = "claims"\n', "resultschema"),
    ('name = "w"\nidempotency = "x"\n[[nodes]]\nname = "a"\nkind = "k"\n'
     'required_role = "cpu"\n', "idempotency"),
    ('name = "w"\n[[nodes]]\nname = "a"\nkind = "k"\nrequired_role = "cpu"\n'
     '[[nodes]]\nname = "b"\nkind = "k"\nrequired_role = "cpu"\n'
     'needs = [{ node = "a", polcy = "run" }]\n', "polcy"),
])
def test_unknown_graph_keys_refused_client_and_server_side(tmp_path, text, key):
    import tomllib

    import msgspec

    from coordctl.commands import UsageError
    from coordctl.workflow import read_graph
    from coordd.net.rpc import _param_decoders
    path = tmp_path / "g.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=f"unknown field `{key}`"):
        read_graph(str(path))
    body = msgspec.msgpack.encode(tomllib.loads(text))  # what an older client would send
    with pytest.raises(msgspec.ValidationError, match=f"unknown field `{key}`"):
        _param_decoders["workflow_submit"].decode(body)
    sched = msgspec.msgpack.encode({"name": "s", "cron": "* * * * *",
                                    "workflow": tomllib.loads(text)})
    with pytest.raises(msgspec.ValidationError, match=f"unknown field `{key}`"):
        _param_decoders["schedule_add"].decode(sched)


async def test_schedule_add_same_name_other_spec_refused_unless_replace(bundle):
    import asyncio
    add = bundle.coord.schedule_add
    first = await add(ScheduleAdd(name="s", cron="*/5 * * * *", workflow=_convert(ONE)))
    again = await add(ScheduleAdd(name="s", cron=" */5 * * * * ", workflow=_convert(ONE)))
    assert first.created and not again.created and not again.replaced  # a repeat: fine
    other = {**ONE, "nodes": [{**ONE["nodes"][0], "kind": "k2"}]}
    for cron, wf, what in (("0 * * * *", ONE, "cron"), ("*/5 * * * *", other, "workflow")):
        with pytest.raises(errors.InvalidState, match=f"schedule s exists with a different "
                                                      f"{what}"):
            await add(ScheduleAdd(name="s", cron=cron, workflow=_convert(wf)))
    listed = (await bundle.coord.schedule_list(Empty())).schedules
    assert [(s.cron, s.next_at) for s in listed] == [("*/5 * * * *", first.next_at)]
    # concurrent adds of one name with different crons: one wins, the others are refused
    outcomes = await asyncio.gather(*(
        add(ScheduleAdd(name="c", cron=f"{m} * * * *", workflow=_convert(ONE)))
        for m in range(5)), return_exceptions=True)
    assert sum(not isinstance(o, Exception) and o.created for o in outcomes) == 1
    assert sum(isinstance(o, errors.InvalidState) for o in outcomes) == 4
    # --replace: the schedule keeps its id and takes the new cron and workflow
    rep = await add(ScheduleAdd(name="s", cron="0 * * * *", workflow=_convert(other),
                                replace=True))
    assert (rep.created, rep.replaced, rep.schedule_id) == (False, True, first.schedule_id)
    assert rep.cron == "0 * * * *" and rep.next_at == 3600.0
    same = await add(ScheduleAdd(name="s", cron="0 * * * *", workflow=_convert(other),
                                 replace=True))
    assert not same.created and not same.replaced


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e308, 0.0,
                                   -1.0, 30 * 86400.0 + 1])
async def test_max_runtime_must_be_finite_and_at_most_30_days(bundle, value):
    from coordd.wire.protocol import Enqueue
    with pytest.raises(errors.BadRequest, match="max_runtime_s must be > 0 and at most"):
        await bundle.coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=2,
                                           max_runtime_s=value))
    node = {**ONE["nodes"][0], "max_runtime_s": value}
    with pytest.raises(errors.BadRequest, match="max_runtime_s must be > 0 and at most"):
        await bundle.coord.workflow_submit(_convert({**ONE, "nodes": [node]}))
    assert sum((await bundle.coord.status()).jobs.values()) == 0


async def test_run_at_must_be_finite_and_30_days_runtime_is_fine(bundle):
    from coordd.wire.protocol import Enqueue
    for value in (float("nan"), float("inf")):
        with pytest.raises(errors.BadRequest, match="run_at must be a finite Unix time"):
            await bundle.coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=2,
                                               run_at=value))
    await bundle.coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=2,
                                       max_runtime_s=30 * 86400.0))


@pytest.mark.parametrize("key", ["inputs", "missing_inputs", "input_artifacts"])
async def test_reserved_payload_keys_refused_at_submit(bundle, key):
    node = {**ONE["nodes"][0], "payload": {key: ["forged"], "ok": 1}}
    with pytest.raises(errors.BadRequest, match=f"payload keys {key} are reserved"):
        await bundle.coord.workflow_submit(_convert({**ONE, "nodes": [node]}))
    assert sum((await bundle.coord.status()).jobs.values()) == 0


async def test_idempotency_key_with_another_graph_refused(bundle):
    from coordd.wire.workflows import ListWorkflows
    two = {"name": "w", "idempotency_key": "k1", "nodes": [
        {"name": "a", "kind": "k", "required_role": "cpu", "payload": {"x": 1, "y": 2}},
        {"name": "b", "kind": "k", "required_role": "cpu", "needs": ["a"]}]}
    first = await bundle.coord.workflow_submit(_convert(two))
    # the same graph written another way: nodes reordered, long-form needs, keys reordered
    same = {**two, "nodes": [
        {"name": "b", "kind": "k", "required_role": "cpu",
         "needs": [{"node": "a", "policy": "skip"}]},
        {"name": "a", "kind": "k", "required_role": "cpu", "payload": {"y": 2, "x": 1}}]}
    again = await bundle.coord.workflow_submit(_convert(same))
    assert first.created and not again.created and again.workflow_id == first.workflow_id
    for change in ({"name": "other"},
                   {"nodes": [two["nodes"][0], {**two["nodes"][1], "needs": []}]},
                   {"nodes": [{**two["nodes"][0], "payload": {"x": 2, "y": 2}},
                              two["nodes"][1]]}):
        with pytest.raises(errors.InvalidState, match="idempotency key 'k1' was used for "
                                                      "another graph"):
            await bundle.coord.workflow_submit(_convert({**two, **change}))
    assert len((await bundle.coord.workflow_list(ListWorkflows())).workflows) == 1


@pytest.mark.parametrize("limit", ["0", "-1", "1001", "x"])
async def test_workflow_list_limit_out_of_range_refused(bundle, limit, capsys):
    from coordctl.__main__ import build_parser
    from coordd.wire.workflows import ListWorkflows
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["workflow", "list", "--limit", limit])
    assert exc.value.code == 2 and "--limit" in capsys.readouterr().err
    if limit != "x":
        with pytest.raises(errors.BadRequest, match="limit must be 1..1000"):
            await bundle.coord.workflow_list(ListWorkflows(limit=int(limit)))
    assert build_parser().parse_args(["workflow", "list", "--limit", "1000"]).limit == 1000


NODE_JSON = '{"name": "w", "nodes": [{"name": "a", "kind": "k", "required_role": "cpu", ' \
            '"payload": {"x": %s}}]}'


@pytest.mark.parametrize("name, text, fragment", [
    ("g.json", NODE_JSON % "NaN", "NaN is not a finite number (JSON has no NaN or Infinity)"),
    ("g.json", NODE_JSON % "-Infinity", "-Infinity is not a finite number"),
    ("g.json", NODE_JSON % "1e999", "1e999 is too large to be a finite number"),
    ("g.toml", 'name = "w"\n[[nodes]]\nname = "a"\nkind = "k"\nrequired_role = "cpu"\n'
               "payload = { x = nan }\n", "workflow.nodes[0].payload.x is not a finite number"),
    ("g.toml", 'name = "w"\n[[nodes]]\nname = "a"\nkind = "k"\nrequired_role = "cpu"\n'
               "max_runtime_s = inf\n", "workflow.nodes[0].max_runtime_s is not a finite"),
    ("g.json", '{"name": ', "not valid JSON: Expecting value at line 1 column 10"),
])
def test_non_finite_numbers_in_a_graph_file_are_named_as_for_payloads(tmp_path, name, text,
                                                                       fragment):
    """A workflow file gets the check `--payload` gets (coordctl.commands.loads_strict and
    coordd.rules.values.check_finite), not `JSON is malformed: invalid character`."""
    from coordctl.commands import UsageError
    from coordctl.workflow import read_graph
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        read_graph(str(path))
    assert fragment in str(info.value) and str(path) in str(info.value)
