"""The job state machine (coordd.rules.transitions): its decisions as pure functions, every row
of its table reached by a decision, and no I/O in it. That every status the SQLite store
writes is a row of the table is tests/unit/test_transition_writes.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from coordd import errors
from coordd.rules import transitions as tr
from coordd.rules.transitions import Held, Transition


def held(**kw: Any) -> Held:
    """A job running under lease token 1 of w1, granted at 102 for 45 s (DESIGN.md)."""
    row = dict(status="running", cancel_requested=0, max_runtime_s=None, attempts=1,
               max_attempts=3, last_token=1, lease_worker_id="w1", lease_token=1,
               granted_at=102.0, expires_at=147.0, result_schema=None, workflow_id=None)
    row.update(kw)
    return Held(**row)


def double(attempts: int) -> float:
    return 10.0 * attempts


# ---------------------------------------------------------------- fencing


def test_reference_timeline_fencing():
    """Lease of 45 s granted at 102 expires at 147: a call at 146.9 passes, one at 147 or
    148 is refused lease_expired (before any reap), with today's message."""
    h = held()
    assert tr.fence(h, "j", "w1", 1, 146.9) is h
    for now in (147.0, 148.0):
        with pytest.raises(errors.LeaseExpired) as exc:
            tr.fence(h, "j", "w1", 1, now)
    assert str(exc.value) == "job j: lease expired at 147.000 (now 148.000)"
    assert exc.value.code == "lease_expired"


def test_fencing_refusals_and_their_messages():
    with pytest.raises(errors.NotFound, match="^job j not found$"):
        tr.fence(None, "j", "w1", 1, 110.0)
    with pytest.raises(errors.LeaseLost,
                       match=r"^job j: lease token 1 of w2 is not current \(job is running\)$"):
        tr.fence(held(), "j", "w2", 1, 110.0)
    with pytest.raises(errors.LeaseLost, match="token 0 of w1"):
        tr.fence(held(), "j", "w1", 0, 110.0)  # a superseded lease of the same worker
    done = held(status="succeeded", lease_worker_id=None, lease_token=None, expires_at=None)
    with pytest.raises(errors.AlreadyCompleted, match="^job j already succeeded$"):
        tr.fence(done, "j", "w1", 1, 200.0)  # a resend of the complete that stored it
    with pytest.raises(errors.LeaseLost):  # an older lease of a job that succeeded later
        tr.fence(msgspec.structs.replace(done, last_token=2), "j", "w1", 1, 200.0)
    with pytest.raises(errors.LeaseLost, match=r"job is waiting"):  # reaped, not reclaimed
        tr.fence(held(status="waiting", lease_worker_id=None, lease_token=None,
                      expires_at=None), "j", "w1", 1, 149.0)


def test_renew_extends_until_max_runtime():
    assert tr.renew(held(), "j", 120.0, 45.0) == 165.0
    capped = held(max_runtime_s=60.0)
    assert tr.renew(capped, "j", 162.0, 30.0) == 192.0
    with pytest.raises(errors.LeaseLost, match="^job j: max runtime 60s exceeded$"):
        tr.renew(capped, "j", 162.5, 30.0)


# ---------------------------------------------------------------- holder outcomes


def test_complete_succeeds_and_settles_only_workflow_nodes():
    d = tr.complete(held(), 120.0, '{"x": 1}', False)
    assert (d.t, d.result_json, d.drop_lease, d.settle, d.invalid) == \
        (tr.COMPLETED, '{"x": 1}', True, False, None)
    assert tr.complete(held(workflow_id="wf"), 120.0, "1", True).settle is True


def test_cancel_requested_wins_over_complete_fail_and_release():
    h = held(cancel_requested=1, workflow_id="wf", result_schema="claims")
    c = tr.complete(h, 120.0, '"not checked"', False)
    assert (c.t, c.last_error, c.reason, c.result_json, c.settle) == (
        tr.CANCEL_HONOURED, "cancelled before completion",
        "cancel requested; result dropped", None, True)
    f = tr.fail(h, 120.0, "boom", True, double)
    assert (f.t, f.last_error, f.reason, f.run_at) == (tr.CANCEL_HONOURED, "boom", "boom", None)
    r = tr.release(h, 120.0, "vacate")
    assert (r.t, r.last_error, r.drop_lease) == (tr.CANCEL_HONOURED, "vacate", True)


def test_fail_with_attempts_left_waits_out_the_backoff():
    d = tr.fail(held(attempts=2), 120.0, "oom", True, double)
    assert (d.t, d.run_at, d.last_error, d.drop_lease, d.settle) == (
        tr.FAIL_RETRY, 140.0, "oom", True, False)
    assert d.reason == "retryable: oom; backoff until 1970-01-01T00:02:20Z"


def test_fail_exhausted_or_permanent_is_the_dead_letter():
    d = tr.fail(held(attempts=3, workflow_id="wf"), 120.0, "oom", True, double)
    assert (d.t, d.last_error, d.reason, d.run_at, d.settle) == (
        tr.FAIL_FAILED, "attempts exhausted (last: oom)", "attempts exhausted (last: oom)",
        None, True)
    p = tr.fail(held(attempts=1), 120.0, "bad input", False, double)
    assert (p.t, p.last_error) == (tr.FAIL_FAILED, "permanent: bad input")


def test_complete_with_a_failing_result_schema_spends_the_attempt():
    bad = '{"claims": [{"text": "t", "label": "fact"}], "evidence": []}'
    d = tr.complete(held(result_schema="claims"), 120.0, bad, False, double)
    assert d.t is tr.INVALID_RETRY and d.run_at == 130.0
    assert d.invalid is not None and d.invalid.startswith("result_invalid (claims)")
    assert d.result_json is None
    last = tr.complete(held(result_schema="claims", attempts=3), 120.0, bad, False, double)
    assert last.t is tr.INVALID_FAILED and last.last_error.startswith("attempts exhausted")
    art = tr.complete(held(result_schema="claims"), 120.0, None, True)  # no backoff given
    assert art.t is tr.INVALID_RETRY and art.run_at == 120.0 and "artifact" in art.invalid
    good = '{"claims": [], "evidence": []}'
    ok = tr.complete(held(result_schema="claims"), 120.0, good, False)
    assert ok.t is tr.COMPLETED and ok.result_json is not None


def test_release_gives_the_job_back_at_once():
    d = tr.release(held(workflow_id="wf"), 120.0, "preempted")
    assert (d.t, d.last_error, d.reason, d.run_at, d.drop_lease, d.settle) == (
        tr.RELEASED, "released: preempted", "released: preempted", 120.0, True, False)


@pytest.mark.parametrize("code", tr.LOST_LEASE_CODES)
def test_lost_lease_requeues_dead_letters_or_honours_the_cancel(code):
    d = tr.lost_lease("w1", 1, 3, 0, code, 149.0)
    assert (d.t, d.run_at, d.last_error, d.reason) == (
        tr.LOST[code][0], 149.0, f"{code} (worker w1 lost)", code)
    d = tr.lost_lease("w1", 3, 3, 0, code, 149.0)
    assert (d.t, d.last_error) == (tr.LOST[code][1], f"attempts exhausted (last: {code})")
    d = tr.lost_lease("w1", 3, 3, 1, code, 149.0)
    assert (d.t, d.last_error, d.reason) == (tr.CANCEL_HONOURED, f"{code} after cancel", code)
    assert all(x.drop_lease and not x.settle for x in [d])
    with pytest.raises(KeyError):
        tr.lost_lease("w1", 1, 3, 0, "tired", 149.0)


def test_dead_letter_counts_the_attempt_only_before_the_take():
    w = tr.dead_letter("waiting", "gates_decode_error", "bad json")
    assert (w.t, w.count_attempt, w.last_error, w.reason) == (
        tr.DEAD_LETTERED["waiting"], True, "gates_decode_error: bad json", "gates_decode_error")
    r = tr.dead_letter("running", "payload_decode_error", "x")
    assert (r.t.from_status, r.t.to_status, r.count_attempt) == ("running", "failed", False)


# ---------------------------------------------------------------- admin


def test_cancel_by_status():
    for status in ("waiting", "blocked"):
        d = tr.cancel(status, "j")
        assert (d.t.from_status, d.t.to_status, d.last_error) == (
            status, "cancelled", "cancelled by admin")
    assert tr.cancel("running", "j").t is tr.CANCEL_REQUEST
    assert tr.cancel("cancelled", "j") is None
    for status, words in (("succeeded", "has succeeded"), ("failed", "has failed"),
                          ("skipped", "was skipped")):
        with pytest.raises(errors.InvalidState, match=(
                f"^job j {words}: only a waiting, blocked or running job can be cancelled$")):
            tr.cancel(status, "j")


def test_retry_only_from_failed_cancelled_skipped():
    for status in ("failed", "cancelled", "skipped"):
        d = tr.retry(status, "j", 300.0)
        assert (d.t.from_status, d.t.to_status, d.run_at, d.reason) == (
            status, "waiting", 300.0, "retried by admin")
    for status, words in (("waiting", "is waiting"), ("blocked", "is blocked"),
                          ("running", "is running"), ("succeeded", "has succeeded")):
        with pytest.raises(errors.InvalidState, match=(
                f"^job j {words}: only a failed, cancelled or skipped job can be retried$")):
            tr.retry(status, "j", 300.0)


# ---------------------------------------------------------------- workflows


def nodes(*spec: tuple[str, str]) -> list[tr.Node]:
    return [tr.Node(f"j{name}", name, status, f"r{name}", None) for name, status in spec]


def test_settle_promotes_skips_cascades_and_ends():
    ns = nodes(("a", "failed"), ("b", "blocked"), ("c", "blocked"), ("d", "blocked"),
               ("e", "succeeded"))
    edges = [("jb", "ja", "skip"), ("jc", "ja", "run"), ("jc", "je", "skip"),
             ("jd", "jb", "skip")]
    plan = tr.settle(ns, edges)
    got = [(s.job_id, s.t, s.reason, s.inputs, s.missing) for s in plan.steps]
    assert got == [
        ("jb", tr.SKIPPED_DEP, "dependency_failed: a", (), ()),
        ("jc", tr.PROMOTED, "dependencies met; running without a", (("e", "je"),), ("a",)),
        ("jd", tr.SKIPPED_DEP, "dependency_skipped: b", (), ()),  # the cascade
    ]
    assert plan.status is None  # c waits
    ns[2].status = "succeeded"
    end = tr.settle(ns, edges)
    assert end.steps == [] and end.status == "partial"
    assert end.summary["skipped"] == [{"node": "b", "reason": "dependency_failed: a"},
                                      {"node": "d", "reason": "dependency_skipped: b"}]


@pytest.mark.parametrize("statuses,end", [
    (("succeeded", "succeeded"), "succeeded"), (("cancelled", "cancelled"), "cancelled"),
    (("cancelled", "failed"), "failed"), (("skipped", "succeeded"), "partial"),
])
def test_workflow_end_status(statuses, end):
    plan = tr.settle(nodes(*zip("ab", statuses)), [])
    assert plan.status == end and tr.Transition("running", end, tr.SETTLE) in tr.WORKFLOW_TABLE


def test_node_payload_carries_inputs_by_name():
    art = {"sha256": "s", "size": 1, "path": "p"}
    assert tr.node_payload([1], [("a", {"r": 1}, None), ("b", 2, art)], ["c"]) == {
        "payload": [1], "inputs": {"a": {"r": 1}, "b": 2}, "input_artifacts": {"b": art},
        "missing_inputs": ["c"]}
    assert tr.node_payload({"k": 1}, [], []) == {"k": 1, "inputs": {}}


# ---------------------------------------------------------------- the table


def every_decision() -> list[Transition]:
    """The transition of every decision over its input space (and the constants the
    stores use directly: enqueue, claim, the reopen moves)."""
    out = [tr.ENQUEUED, tr.ENQUEUED_BLOCKED, tr.CLAIMED, tr.REBLOCKED, tr.UNSKIPPED,
           tr.SKIPPED_ABSENT]
    bad = '{"claims": 1}'
    for cancel in (0, 1):
        for attempts in (1, 3):
            for schema in (None, "claims"):
                h = held(cancel_requested=cancel, attempts=attempts, result_schema=schema)
                out.append(tr.complete(h, 120.0, bad, False, double).t)
                out.append(tr.complete(h, 120.0, None, True, double).t)
                for retryable in (True, False):
                    out.append(tr.fail(h, 120.0, "e", retryable, double).t)
                out.append(tr.release(h, 120.0, "r").t)
                for code in tr.LOST_LEASE_CODES:
                    out.append(tr.lost_lease("w", attempts, 3, cancel, code, 149.0).t)
    for status in tr.JOB_STATUSES:
        for decide in (lambda: tr.cancel(status, "j"), lambda: tr.retry(status, "j", 1.0)):
            try:
                d = decide()
            except errors.InvalidState:
                continue
            if d is not None:
                out.append(d.t)
    out += [tr.dead_letter(s, "c", "d").t for s in ("waiting", "running")]
    plan = tr.settle(nodes(("a", "failed"), ("b", "blocked"), ("c", "blocked")),
                     [("jb", "ja", "skip"), ("jc", "ja", "run")])
    out += [s.t for s in plan.steps]
    return out


def test_every_decision_is_a_row_of_the_table_and_every_row_is_reached():
    made = every_decision()
    assert set(made) - tr.TABLE == set()
    assert tr.TABLE - set(made) == set()
    for t in tr.TABLE:
        assert t.to_status in tr.JOB_STATUSES and t.from_status in (None, *tr.JOB_STATUSES)
    doc = _table_doc()
    for cause in {t.cause for t in tr.TABLE}:
        assert f"- {cause}" in doc or f", {cause}:" in doc, f"cause {cause} has no line"


def _table_doc() -> str:
    """The docstring under TABLE in coordd/rules/transitions/table.py (a module-level string)."""
    text = (Path(tr.__file__).parent / "table.py").read_text()
    return text[text.index("TABLE: frozenset"):text.index("WORKFLOW_TABLE: frozenset")]


def test_transitions_is_pure():
    """coordd.rules.transitions imports no store, no sqlite3, no I/O: a second store can call it."""
    import ast
    for path in sorted(Path(tr.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {f"{n.module}.{a.name}" if n.module in ("coordd", "coordd.rules") else n.module
                 for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        mods = {m for m in mods if not m.startswith("coordd.rules.transitions.")}
        assert mods <= {"__future__", "math", "collections.abc", "typing", "msgspec",
                        "coordd.errors", "coordd.rules.results", "coordd.rules.times"}, (path, mods)
        assert "execute(" not in path.read_text()
