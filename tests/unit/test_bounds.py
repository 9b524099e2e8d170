"""Issue 14, bugs 1, 4 and 5 at coordd's boundary: times and durations out of range,
non-finite numbers in any stored JSON value, and idempotency keys reused with another
request. Each is refused with a stable code naming the field, and nothing is written."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from coordd import errors
from coordd.wire.protocol import (
    Claim, Enqueue, EnqueueBatch, Heartbeat, ReadMessages, Renew, SendMessage,
)
from coordd.rules.times import TIME_MAX_S
from tests.conftest import COOL
from tests.unit.test_stored_values import FIELDS, NAMED, _rows, _store_each

NAN, INF = float("nan"), float("inf")


def _job(**kw):
    return Enqueue(kind="k", required_role="cpu", priority=1, **{"payload": {}, **kw})


# ---------------------------------------------------------------- bug 1: time ranges

TIMES = [
    ("run_at", {"run_at": 1e15}, "run_at must be a finite Unix time in 0..4102444800"),
    ("run_at", {"run_at": -1.0}, "run_at must be a finite Unix time in 0..4102444800"),
    ("run_at", {"run_at": TIME_MAX_S + 1}, "2100-01-01T00:00:00Z"),
    ("delay_s", {"delay_s": 1e12}, "delay_s must be >= 0 and at most"),
    ("delay_s", {"delay_s": -5.0}, "delay_s must be >= 0 and at most"),
    ("delay_s", {"delay_s": NAN}, "delay_s must be >= 0"),
    ("delay_s+run_at", {"delay_s": 5.0, "run_at": 200.0}, "run_at or delay_s, not both"),
    ("max_runtime_s", {"max_runtime_s": INF}, "max_runtime_s must be > 0 and at most"),
    ("gates", {"gates": {"min_user_idle_s": 1e300}},
     "gates.min_user_idle_s must be >= 0 and at most"),
    ("gates", {"gates": {"min_user_idle_s": -1.0}}, "gates.min_user_idle_s must be >= 0"),
]


@pytest.mark.parametrize("field,kw,match", TIMES, ids=[f"{t[0]}={list(t[1].values())}"
                                                      for t in TIMES])
async def test_enqueue_times_and_durations_out_of_range_are_refused(bundle, field, kw, match):
    before = _rows(bundle.db_path)
    with pytest.raises(errors.BadRequest, match=match):
        await bundle.coord.enqueue(_job(**kw))
    with pytest.raises(errors.BadRequest, match=r"^jobs\[1\]: .*" + match):
        await bundle.coord.enqueue_batch(EnqueueBatch(jobs=[_job(), _job(**kw)]))
    assert _rows(bundle.db_path) == before


async def test_delay_s_runs_on_coordds_clock_and_range_edges_are_accepted(bundle):
    job = await bundle.enqueue(delay_s=60.0)
    assert (await bundle.coord.get_job(_id(job))).run_at == bundle.clock.wall() + 60
    await bundle.enqueue(run_at=0.0)
    await bundle.enqueue(run_at=TIME_MAX_S)
    await bundle.enqueue(delay_s=0.0)


def _id(job_id):
    from coordd.wire.protocol import JobId
    return JobId(job_id=job_id)


@pytest.mark.parametrize("lease_s", [NAN, INF, -1.0, 0.0, 1e12])
async def test_lease_s_out_of_range_is_refused_on_claim_and_renew(bundle, lease_s):
    await bundle.worker("w1")
    job = await bundle.enqueue()
    with pytest.raises(errors.BadRequest, match="lease_s must be > 0 and at most"):
        await bundle.coord.claim(Claim(worker_id="w1", lease_s=lease_s))
    got = await bundle.claim("w1", lease_s=30.0)
    with pytest.raises(errors.BadRequest, match="lease_s must be > 0 and at most"):
        await bundle.coord.renew(Renew(job_id=job, worker_id="w1", token=got.lease.token,
                                       lease_s=lease_s))
    # in range, it is still clamped to lease_min_s..lease_max_s
    huge = await bundle.coord.renew(Renew(job_id=job, worker_id="w1", token=got.lease.token,
                                          lease_s=86400.0))
    assert huge.lease_s == bundle.coord.config.lease_max_s


@pytest.mark.parametrize("field,value", [("ttl_s", INF), ("ttl_s", 1e12), ("ttl_s", NAN),
                                         ("visibility_s", INF), ("visibility_s", -1.0)])
async def test_hub_durations_out_of_range_are_refused(bundle, field, value):
    with pytest.raises(errors.BadRequest, match=f"{field} must be > 0"):
        if field == "ttl_s":
            await bundle.coord.send_message(SendMessage(sender="a", recipient="b",
                                                        content="x", ttl_s=value))
        else:
            await bundle.coord.read_messages(ReadMessages(reader="b", visibility_s=value))
    assert _rows(bundle.db_path)["messages"] == 0


async def test_workflow_node_runtime_out_of_range_is_refused(bundle):
    from tests.unit.test_workflow_input import ONE
    from tests.unit.test_workflows import _convert
    node = {**ONE["nodes"][0], "max_runtime_s": 1e300}
    with pytest.raises(errors.BadRequest, match="max_runtime_s must be > 0 and at most"):
        await bundle.coord.workflow_submit(_convert({**ONE, "nodes": [node]}))


# ---------------------------------------------------------------- bug 4: non-finite numbers


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize("field", FIELDS)
async def test_every_stored_value_with_a_non_finite_number_is_refused(bundle, field, bad):
    """msgspec writes NaN and infinities to JSON as null: stored, the value read back is
    not the one sent. Refused naming the path; nothing changes."""
    value = {"ok": [1, 2.5, None], "deep": [{"x": bad}]}
    if field == "gates":  # a gate key's value itself
        value = bad
    before = _rows(bundle.db_path)
    if field in ("result", "checkpoint"):
        await bundle.worker("w1")
        before = None
    name = NAMED.get(field, field)
    match = {"gates": r"gates\.max_memory_pct is not a finite number",
             "readings": r"readings\.extra\.deep\[0\]\.x is not a finite number",
             "metadata": r"metadata\.m\.deep\[0\]\.x is not a finite number",
             "agent metadata": r"metadata\.m\.deep\[0\]\.x is not a finite number",
             }.get(field, rf"{name}\.deep\[0\]\.x is not a finite number")
    with pytest.raises(errors.BadRequest, match=match):
        await _store_each(bundle, field, value)
    if before is not None:
        assert _rows(bundle.db_path) == before
    else:
        conn = sqlite3.connect(bundle.db_path)
        assert conn.execute("SELECT status, result_json, checkpoint_json FROM jobs"
                            ).fetchall() == [("running", None, None)]
        conn.close()


async def test_a_workflow_node_payload_with_nan_is_refused(bundle):
    from tests.unit.test_workflow_input import ONE
    from tests.unit.test_workflows import _convert
    node = {**ONE["nodes"][0], "payload": {"x": [NAN]}}
    with pytest.raises(errors.BadRequest, match=r"payload\.x\[0\] is not a finite number"):
        await bundle.coord.workflow_submit(_convert({**ONE, "nodes": [node]}))
    assert sum((await bundle.coord.status()).jobs.values()) == 0


async def test_null_and_finite_numbers_still_store_as_sent(bundle):
    payload = {"a": None, "b": [1e308, -0.0, 5], "c": "NaN null"}
    job = await bundle.enqueue(payload=payload)
    assert (await bundle.coord.get_job(_id(job))).payload == payload


@pytest.mark.parametrize("key,reason_key", [("temperature_c", "temperature_reason"),
                                            ("memory_used_pct", "memory_reason"),
                                            ("user_idle_s", "user_idle_reason")])
async def test_a_non_finite_gate_reading_is_unknown_with_its_reason(bundle, key, reason_key):
    await bundle.coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu"],
                                           readings={**COOL, key: NAN}))
    w = (await bundle.coord.workers()).workers[0]
    assert w.readings[key] is None
    assert "non-finite" in w.readings[reason_key]
    prefix = {"temperature_c": "temperature", "memory_used_pct": "memory",
              "user_idle_s": "user idle"}[key]
    assert any(n.startswith(prefix + ":") and "non-finite" in n for n in w.notes), w.notes
    if key == "user_idle_s":  # P3 fails closed on unknown idle (its explicit policy)
        assert w.verdicts["p3"] == ["user_active"]


# ---------------------------------------------------------------- bug 5: idempotency keys


async def test_same_key_same_request_returns_the_job_another_request_is_refused(bundle,
                                                                                caplog):
    caplog.set_level(logging.INFO, logger="coordd.service")
    c = bundle.coord
    first = await c.enqueue(_job(idempotency_key="k1", payload={"a": 1, "b": [1, 2]}))
    assert first.created
    # the same request, its object keys in another order: the same job
    again = await c.enqueue(_job(idempotency_key="k1", payload={"b": [1, 2], "a": 1}))
    assert (again.job_id, again.created) == (first.job_id, False)
    # an explicit default is the same request as the default left out
    explicit = await c.enqueue(_job(idempotency_key="k1", payload={"a": 1, "b": [1, 2]},
                                    max_attempts=c.config.max_attempts_default))
    assert (explicit.job_id, explicit.created) == (first.job_id, False)
    for other in ({"payload": {"a": 2}}, {"priority": 2}, {"kind": "k2"},
                  {"required_role": "gpu"}, {"max_attempts": 9}, {"run_at": 500.0},
                  {"delay_s": 5.0}, {"gates": {"max_memory_pct": 50}},
                  {"max_runtime_s": 60.0}):
        fields = {"kind": "k", "required_role": "cpu", "priority": 1,
                  "payload": {"a": 1, "b": [1, 2]}, **other}
        with pytest.raises(errors.InvalidState,
                           match=f"idempotency key 'k1' is taken by job {first.job_id}"):
            await c.enqueue(Enqueue(idempotency_key="k1", **fields))
    assert _rows(bundle.db_path)["jobs"] == 1
    assert [r for r in caplog.records if getattr(r, "action", None) == "idempotency_conflict"]


async def test_a_resent_delay_is_the_same_request(bundle):
    first = await bundle.coord.enqueue(_job(idempotency_key="d", delay_s=60.0))
    bundle.clock.advance(5)
    again = await bundle.coord.enqueue(_job(idempotency_key="d", delay_s=60.0))
    assert (again.job_id, again.created) == (first.job_id, False)


async def test_batch_keys_follow_the_same_rule_and_name_the_job(bundle):
    c = bundle.coord
    res = await c.enqueue_batch(EnqueueBatch(jobs=[
        _job(idempotency_key="b1", payload={"i": 1}),
        _job(idempotency_key="b1", payload={"i": 1})]))  # repeated within the batch
    assert [j.created for j in res.jobs] == [True, False]
    assert res.jobs[0].job_id == res.jobs[1].job_id
    with pytest.raises(errors.InvalidState, match=r"^jobs\[1\]: idempotency key 'b1'"):
        await c.enqueue_batch(EnqueueBatch(jobs=[
            _job(idempotency_key="b2"), _job(idempotency_key="b1", payload={"i": 2})]))
    assert _rows(bundle.db_path)["jobs"] == 1  # all or none: b2 was not stored either


async def test_a_job_stored_before_the_request_hash_takes_any_repeat(bundle):
    """Rows from before schema v9 have no hash: a repeat of their key is answered with
    the job, as it was when they were stored (docs/decisions.md)."""
    first = await bundle.coord.enqueue(_job(idempotency_key="old", payload={"v": 1}))
    conn = sqlite3.connect(bundle.db_path)
    conn.execute("UPDATE jobs SET request_sha256 = NULL")
    conn.commit()
    conn.close()
    again = await bundle.coord.enqueue(_job(idempotency_key="old", payload={"v": 2}))
    assert (again.job_id, again.created) == (first.job_id, False)
