"""Every client JSON value coordd stores passes one check (coordd.rules.values): nesting depth,
JSON types and size, refused with a stable code naming the field, nothing written."""

from __future__ import annotations

import sqlite3

import pytest

from coordd import errors
from coordd.rules import values
from coordd.wire.protocol import (
    AgentStatusUpdate, BroadcastMessage, Checkpoint, Complete, Enqueue, EnqueueBatch,
    Heartbeat, SendMessage,
)
from tests.conftest import COOL

LIMIT = values.JSON_DEPTH_MAX


def nested(depth: int, leaf: object = 1) -> object:
    """`depth` levels of arrays/objects, alternating, around `leaf`."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _rows(db_path: str) -> dict[str, int]:
    conn = sqlite3.connect(db_path)
    try:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("jobs", "messages", "agents", "workers")}
    finally:
        conn.close()


def test_depth_counts_levels_of_arrays_and_objects():
    values.check_depth("v", nested(LIMIT))
    values.check_depth("v", [nested(LIMIT - 1), nested(3)])
    values.check_depth("v", "x" * 1000)
    with pytest.raises(errors.BadRequest, match=r"^v nests deeper than 64 levels"):
        values.check_depth("v", nested(LIMIT + 1))
    with pytest.raises(errors.BadRequest):  # deep inside a wide value, not the first branch
        values.check_depth("v", {"a": list(range(100)), "b": [1, {"c": nested(LIMIT)}]})
    # brackets inside strings do not count
    assert values.encode("v", ["[" * 500, "{" * 500], 10_000).startswith('["[[[')


async def _store_each(bundle, field: str, value: object) -> None:
    """Hand `value` to coordd as `field`, through the RPC method that stores it."""
    c = bundle.coord
    if field in ("payload", "gates"):
        kw = {"payload": value} if field == "payload" else {"gates": {"max_memory_pct": value}}
        await c.enqueue(Enqueue(kind="k", required_role="cpu", priority=1, **kw))
    elif field == "batch payload":
        await c.enqueue_batch(EnqueueBatch(jobs=[
            Enqueue(kind="k", required_role="cpu", priority=1, payload=1),
            Enqueue(kind="k", required_role="cpu", priority=1, payload=value)]))
    elif field in ("result", "checkpoint"):
        await bundle.worker("w1")
        job = await bundle.enqueue(priority=1)
        lease = (await bundle.claim("w1")).lease
        ref = {"job_id": job, "worker_id": "w1", "token": lease.token}
        if field == "result":
            await c.complete(Complete(**ref, result=value))
        else:
            await c.checkpoint(Checkpoint(**ref, checkpoint=value))
    elif field == "readings":
        await c.heartbeat(Heartbeat(worker_id="w9", roles=["cpu"],
                                    readings={**COOL, "extra": value}))
    elif field in ("content", "metadata"):
        await c.send_message(SendMessage(sender="a", recipient="b", **{field: (
            value if field == "content" else {"m": value})}))
    elif field == "broadcast content":
        await c.broadcast(BroadcastMessage(sender="a", content=value))
    elif field == "agent metadata":
        await c.update_agent_status(AgentStatusUpdate(name="a", status="idle",
                                                      metadata={"m": value}))
    else:
        raise AssertionError(field)


FIELDS = ["payload", "batch payload", "gates", "result", "checkpoint", "readings", "content",
          "metadata", "broadcast content", "agent metadata"]
NAMED = {"batch payload": "payload", "broadcast content": "content",
         "agent metadata": "metadata"}


@pytest.mark.parametrize("field", FIELDS)
async def test_every_stored_value_nested_too_deep_is_refused_and_nothing_changes(bundle, field):
    """250 levels decode fine from msgpack but crash readers (the MCP SDK stops at ~255):
    refused with bad_request naming the field; what was stored before stays as it was."""
    value = nested(250)
    before = _rows(bundle.db_path)
    if field in ("result", "checkpoint"):
        await bundle.worker("w1")
        before = None  # the job and lease are set up inside; compare the job afterwards
    match = f"{NAMED.get(field, field)} nests deeper than {LIMIT} levels"
    if field == "gates":  # gate keys take numbers and strings: refused by their type first
        match = "^gates: "
    with pytest.raises(errors.BadRequest, match=match):
        await _store_each(bundle, field, value)
    if before is not None:
        assert _rows(bundle.db_path) == before
    else:
        conn = sqlite3.connect(bundle.db_path)
        assert conn.execute("SELECT status, result_json, checkpoint_json FROM jobs"
                            ).fetchall() == [("running", None, None)]
        conn.close()


@pytest.mark.parametrize("field", ["payload", "result", "content", "agent metadata"])
async def test_a_value_at_the_depth_cap_is_stored(bundle, field):
    # the field's own wrapper (metadata {"m": ...}) adds a level
    await _store_each(bundle, field, nested(LIMIT - 1))


async def test_a_workflow_node_payload_nested_too_deep_is_refused(bundle):
    from tests.unit.test_workflow_input import ONE
    from tests.unit.test_workflows import _convert
    node = {**ONE["nodes"][0], "payload": {"d": nested(250)}}
    with pytest.raises(errors.BadRequest, match="payload nests deeper than 64 levels"):
        await bundle.coord.workflow_submit(_convert({**ONE, "nodes": [node]}))
    assert sum((await bundle.coord.status()).jobs.values()) == 0
