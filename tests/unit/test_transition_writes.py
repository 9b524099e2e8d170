"""Every status the SQLite store writes is a row of the job state machine's table
(coordd.rules.transitions.TABLE): each statement that writes jobs.status serves a known
transition, `apply` refuses the transitions it does not write, and in a run over the real
service every change of jobs.status has its event, in order, whose (from, to, cause) is a
row of the table. The decisions themselves are tests/unit/test_transitions.py."""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

import msgspec
import pytest

import coordd.store
from coordd.rules import transitions as tr
from coordd.rules.transitions import Transition
from coordd.wire.protocol import Complete, Empty, Fail, JobId
from coordd.wire.workers import Goodbye, Release
from coordd.wire.workflows import WorkflowSubmit


# SQL statements of coordd.store that write jobs.status, and the transitions they serve.
STATUS_WRITES = {
    "SQL_TAKE": "claim", "SQL_SUCCEED": "complete", "SQL_SUCCEED_ARTIFACT": "complete",
    "SQL_TO_WAITING": "fail/lost/invalid",
    "SQL_RELEASE": "release", "SQL_RETRY": "retry", "SQL_DEAD_LETTER": "dead_letter",
    "SQL_TO_TERMINAL": "failed/cancelled", "SQL_PROMOTE": "dependencies_met",
    "SQL_SKIP": "dependency_ended/worker_absent", "SQL_UNSKIP": "reopen",
    "SQL_REBLOCK": "reopen", "SQL_ENQUEUE": "enqueue", "SQL_INSERT_NODE": "enqueue",
}
WRITES_STATUS = re.compile(r"UPDATE jobs SET (?:(?!WHERE).)*\bstatus = |INSERT INTO jobs \(",
                           re.S)  # status in the SET list (not the WHERE), or an insert


def test_every_status_writing_statement_is_known():
    """A new statement that writes jobs.status must serve a transition of the table (add
    it here with its cause, and apply a decision of coordd.rules.transitions with it)."""
    found = set()
    for info in pkgutil.iter_modules(coordd.store.__path__):
        mod = importlib.import_module(f"coordd.store.{info.name}")
        found |= {name for name, v in vars(mod).items()
                  if name.startswith("SQL_") and isinstance(v, str) and WRITES_STATUS.search(v)}
    found |= {name for name, v in vars(coordd.store).items()
              if name.startswith("SQL_") and isinstance(v, str) and WRITES_STATUS.search(v)}
    assert found == set(STATUS_WRITES)


# ---------------------------------------------------------------- an integration run


def cause_of(from_status: str | None, to: str, reason: str | None) -> str | None:
    """Which cause an event's reason names (None: a same-status note, no transition)."""
    r = reason or ""
    if from_status is None:
        return tr.ENQUEUE
    if from_status == to:
        return tr.CANCEL if r == "cancel requested" else None
    if to == "cancelled":
        return tr.CANCEL if r == "cancelled by admin" else tr.CANCEL_REQUESTED
    for prefix, cause in (("claimed (token", tr.CLAIM), ("released: ", tr.RELEASE),
                          ("retried by admin", tr.RETRY), ("dependencies met", tr.DEPENDENCIES_MET),
                          ("dependency_", tr.DEPENDENCY_ENDED), ("worker_absent", tr.WORKER_ABSENT),
                          ("retried: waits", tr.REOPEN), ("dependency ", tr.REOPEN),
                          ("permanent: ", tr.FAIL)):
        if r.startswith(prefix):
            return cause
    if r.endswith("_decode_error"):
        return tr.DEAD_LETTER
    if to == "succeeded":
        return tr.COMPLETE
    last = r.removeprefix("retryable: ").removeprefix("attempts exhausted (last: ")
    if last.startswith("result_invalid"):
        return tr.RESULT_INVALID
    for code in tr.LOST_LEASE_CODES:
        if last.startswith(code):
            return code
    return tr.FAIL


TRACE = (
    "CREATE TEMP TABLE IF NOT EXISTS status_writes (n INTEGER PRIMARY KEY, job_id TEXT, "
    "old TEXT, new TEXT)",
    "CREATE TEMP TRIGGER IF NOT EXISTS status_writes_u AFTER UPDATE OF status ON main.jobs "
    "WHEN old.status IS NOT new.status BEGIN INSERT INTO status_writes (job_id, old, new) "
    "VALUES (new.job_id, old.status, new.status); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS status_writes_i AFTER INSERT ON main.jobs BEGIN "
    "INSERT INTO status_writes (job_id, old, new) VALUES (new.job_id, NULL, new.status); END",
)


async def test_every_status_write_of_a_run_is_an_event_of_the_table(make_bundle):
    """A run over the service (the writer's own connection traced by a trigger) through
    every holder, admin and reaper outcome and a workflow: each change of jobs.status has
    its event, in order, and each event's (from, to, cause) is a row of TABLE."""
    b = await make_bundle(max_attempts_default=2)
    coord, clock = b.coord, b.clock
    await coord.store.writer.run(lambda conn, now: [conn.execute(s) for s in TRACE] and None)
    await b.worker("w1")

    async def take(job_id: str, worker: str = "w1", lease_s: float = 30.0):
        got = await b.claim(worker, lease_s=lease_s)
        assert got.job is not None and got.job.job_id == job_id, got
        return got.lease.token

    def ref(job_id: str, token: int, worker: str = "w1") -> dict[str, Any]:
        return dict(job_id=job_id, worker_id=worker, token=token)

    j = await b.enqueue()  # complete
    await coord.complete(Complete(**ref(j, await take(j)), result={"ok": 1}))
    j = await b.enqueue()  # fail: retry after backoff, exhausted, retry, permanent
    await coord.fail(Fail(**ref(j, await take(j)), error="oom"))
    clock.advance(3600)
    await b.worker("w1")
    await coord.fail(Fail(**ref(j, await take(j)), error="oom"))
    await coord.retry(JobId(job_id=j))
    await coord.fail(Fail(**ref(j, await take(j)), error="bad", retryable=False))
    j = await b.enqueue()  # release, then cancel requested + complete
    await coord.release(Release(**ref(j, await take(j)), reason="preempted"))
    t = await take(j)
    await coord.cancel(JobId(job_id=j))
    await coord.complete(Complete(**ref(j, t), result=1))
    j = await b.enqueue()  # cancel waiting, retry, lease expired twice (exhausted)
    await coord.cancel(JobId(job_id=j))
    await coord.retry(JobId(job_id=j))
    for _ in range(2):
        await take(j, lease_s=10.0)
        clock.advance(11)
        await b.worker("w1")
        await coord.reap(Empty())
    j = await b.enqueue()  # worker lost: requeued, then exhausted
    for _ in range(2):
        await b.worker("w2")
        await take(j, "w2")
        await coord.goodbye(Goodbye(worker_id="w2"))
    j = await b.enqueue(result_schema="claims")  # result_invalid, twice
    for _ in range(2):
        await coord.complete(Complete(**ref(j, await take(j)), result={"claims": 1}))
        clock.advance(3600)
        await b.worker("w1")
    for column in ("payload_json", "gates_json"):  # dead letters
        j = await b.enqueue()
        await coord.store.writer.run(lambda conn, now: conn.execute(
            f"UPDATE jobs SET {column} = '{{' WHERE job_id = ?", (j,)) and None)
        assert (await b.claim("w1")).job is None
    wf = await coord.workflow_submit(msgspec.convert({"name": "g", "nodes": [
        {"name": "a", "kind": "k", "required_role": "cpu"},
        {"name": "b", "kind": "k", "required_role": "cpu", "needs": ["a"]},
        {"name": "c", "kind": "k", "required_role": "cpu",
         "needs": [{"node": "a", "policy": "run"}]},
        {"name": "d", "kind": "k", "required_role": "cpu", "needs": ["b"]},
        {"name": "e", "kind": "k", "required_role": "cpu", "needs": ["a"]},
    ]}, WorkflowSubmit))
    node = wf.jobs
    await coord.fail(Fail(**ref(node["a"], await take(node["a"])), error="no",
                          retryable=False))  # b, d, e skipped; c queued without a
    await coord.retry(JobId(job_id=node["a"]))  # b, d, e blocked again
    await coord.cancel(JobId(job_id=node["b"]))  # d skipped
    await coord.retry(JobId(job_id=node["d"]))  # d waits for b again: skipped at once

    def read(conn, now):
        writes = conn.execute("SELECT job_id, old, new FROM temp.status_writes "
                              "ORDER BY n").fetchall()
        events = conn.execute("SELECT job_id, from_status, to_status, reason FROM job_events "
                              "ORDER BY event_id").fetchall()
        return writes, events
    writes, events = await coord.store.writer.run(read)
    seen: set[Transition] = set()
    moves: dict[str, list[tuple]] = {}
    for job_id, frm, to, reason in events:
        cause = cause_of(frm, to, reason)
        if cause is None:
            continue
        t = Transition(frm, to, cause)
        assert t in tr.TABLE, (job_id, t, reason)
        seen.add(t)
        if frm != to:
            moves.setdefault(job_id, []).append((frm, to, reason))
    per_job: dict[str, list[tuple]] = {}
    for job_id, old, new in writes:
        per_job.setdefault(job_id, []).append((old, new))
    assert set(per_job) == set(moves)
    for job_id, ws in per_job.items():
        es = list(moves[job_id])
        i = 0
        for k, w in enumerate(ws):
            if i < len(es) and es[i][:2] == w:
                i += 1
                continue
            # a take whose payload did not decode: dead-lettered from running at once
            assert w == ("waiting", "running") and ws[k + 1] == ("running", "failed") \
                and es[i][2].endswith("_decode_error"), (job_id, ws, es)
        assert i == len(es), (job_id, ws, es)
    assert tr.TABLE - seen == {tr.SKIPPED_ABSENT}  # (tests/unit/test_workflows.py has it)


def test_store_apply_refuses_transitions_it_does_not_write(tmp_path):
    import sqlite3
    conn = sqlite3.connect(str(tmp_path / "a.db"), isolation_level=None)
    coordd.store.migrate(conn)
    for t in (tr.CLAIMED, tr.ENQUEUED, tr.PROMOTED, tr.SKIPPED_DEP, tr.REBLOCKED):
        with pytest.raises(ValueError, match="does not write"):
            coordd.store.jobs.apply(conn, 1.0, "j", None, tr.Decision(t=t))
    conn.close()
