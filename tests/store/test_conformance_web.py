"""The web view's reads over both stores (coordd.store.api_web): job pages by filter and
window, counts, end rates, leases, a workflow's events, the message log, ids by prefix;
the same answers from SQLite and PostgreSQL, `now` pinned."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.ids import JobIds
from coordd.store.api import LeaseRef
from coordd.store.api_web import JobFinder
from coordd.store.api_workflows import NewNode, NewWorkflow
from tests.store.conftest import T0
from tests.store.test_conformance_hub import read, send


async def jobs_of_every_kind(b) -> dict[str, str]:
    """a: waiting; b (payload 'Needle'): succeeded by w1 at T0+2; c: failed by w2 at T0+3
    (error 'Out Of NEEDLES'); d: running on w1; e: waiting, role gpu."""
    ids = {"a": await b.enqueue(kind="embed", role="gpu")}
    await b.worker("w1", roles=["cpu"])
    await b.worker("w2", roles=["cpu"])
    ids["b"] = await b.enqueue(kind="embed", payload_json='{"q": "Needle"}')
    got = await b.claim("w1", now=T0 + 1)
    await b.store.complete(LeaseRef(ids["b"], "w1", got.lease.token), "1", now=T0 + 2)
    ids["c"] = await b.enqueue(kind="chat", max_attempts=1)
    got = await b.claim("w2", now=T0 + 2)
    await b.store.fail(LeaseRef(ids["c"], "w2", got.lease.token), "Out Of NEEDLES", False,
                       lambda n: 0.0, now=T0 + 3)
    ids["d"] = await b.enqueue(kind="chat", priority=1)
    await b.claim("w1", now=T0 + 4)
    ids["e"] = await b.enqueue(kind="embed", role="gpu", priority=0)
    return ids


async def find(b, before=None, scan=100, cap=100, limit=100, **flt):
    rows, n = await b.store.find_job_rows(JobFinder(**flt), before, scan, cap, limit)
    return [r.job_id for r in rows], n


async def test_find_job_rows_by_every_filter_newest_first(bundle):
    b = bundle
    j = await jobs_of_every_kind(b)
    name = {v: k for k, v in j.items()}

    async def names(**kw):
        found, n = await find(b, **kw)
        return "".join(name[x] for x in found), n
    assert await names() == ("edcba", 5)
    assert await names(kind="embed") == ("eba", 3)
    assert await names(role="gpu", priority=0) == ("e", 1)
    assert await names(worker="w1") == ("db", 2)  # jobs w1 ever held (the event log)
    assert await names(text="needle") == ("cb", 2)  # payload or error, ASCII case folded
    assert await names(status="waiting") == ("ea", 2)
    assert await names(status="running") == ("d", 1)
    assert await names(limit=2) == ("ed", 5)
    assert await names(cap=3, limit=2) == ("ed", 3)
    assert await names(before=j["c"]) == ("ba", 2)
    assert await names(scan=2) == ("ed", 2)  # a window of two jobs
    assert await names(scan=2, kind="chat") == ("d", 1)
    rows, _ = await b.store.find_job_rows(JobFinder(status="running"), None, 10, 10, 10)
    r = rows[0]
    assert (r.kind, r.required_role, r.priority, r.status, r.attempts, r.max_attempts,
            r.worker_id, r.lease_expires_at, r.created_at, r.updated_at, r.last_error) == (
        "chat", "cpu", 1, "running", 1, 3, "w1", T0 + 34, T0, T0 + 4, None)
    failed, _ = await b.store.find_job_rows(JobFinder(status="failed"), None, 10, 10, 10)
    assert failed[0].last_error == "permanent: Out Of NEEDLES" and failed[0].worker_id is None
    with pytest.raises(errors.NotFound, match="the page's `before`"):
        await find(b, before="nosuch")


async def test_the_window_end_says_where_the_next_page_starts(bundle):
    b = bundle
    j = await jobs_of_every_kind(b)
    assert await b.store.find_window_end(None, None, 2) == j["d"]
    assert await b.store.find_window_end(None, j["d"], 2) == j["b"]
    assert await b.store.find_window_end(None, j["b"], 2) is None  # a, then nothing
    assert await b.store.find_window_end(None, None, 5) is None
    assert await b.store.find_window_end("waiting", None, 1) == j["e"]
    assert await b.store.find_window_end("waiting", None, 2) is None


async def test_counts_rates_and_leases(bundle):
    b = bundle
    j = await jobs_of_every_kind(b)
    counts = sorted(c for c in await b.store.job_counts() if c[2])
    assert counts == [("failed", 2, 1), ("running", 1, 1), ("succeeded", 2, 1),
                      ("waiting", 0, 1), ("waiting", 2, 1)]
    rows, scanned = await b.store.end_rates(T0 + 1, 1.0)
    assert sorted(rows) == [(1, "succeeded", 1), (2, "failed", 1)]
    assert scanned == 5  # the events at or after T0 + 1: 2 claims, 2 ends, an enqueue
    held = await b.store.held_leases()
    assert [(h.worker_id, h.job_id, h.kind, h.priority, h.granted_at, h.expires_at)
            for h in held] == [("w1", j["d"], "chat", 1, T0 + 4, T0 + 34)]
    assert await b.store.live_reservations(now=T0 + 5) == []


async def test_a_workflows_events_in_order(bundle):
    b = bundle
    ids = JobIds()
    wf = NewWorkflow(workflow_id=ids.new(T0), name="wf", nodes=[
        NewNode(job_id=ids.new(T0), name="first", kind="k", required_role="cpu", priority=2,
                payload={}, max_attempts=1),
        NewNode(job_id=ids.new(T0), name="second", kind="k", required_role="cpu",
                priority=2, payload={}, max_attempts=1, needs=[("first", "skip")])])
    await b.store.workflow_submit(wf, now=T0)
    await b.worker("w1")
    got = await b.claim("w1", now=T0 + 1)
    await b.store.complete(LeaseRef(got.job.job_id, "w1", got.lease.token), "1", now=T0 + 2)
    events = await b.store.workflow_events(wf.workflow_id)
    assert [(e[0], e[2], e[3], e[4], e[5]) for e in events] == [
        ("first", T0, None, None, "waiting"), ("second", T0, None, None, "blocked"),
        ("first", T0 + 1, "w1", "waiting", "running"),
        ("first", T0 + 2, "w1", "running", "succeeded"),
        ("second", T0 + 2, None, "blocked", "waiting")]
    assert await b.store.workflow_events("nosuch") == []


async def test_the_message_log_pages_newest_first_with_deliveries(bundle):
    b = bundle
    for i in range(3):
        await send(b, now=T0 + i, message_id=f"m{i}", content="x" * 300 if i == 0 else i)
    await read(b, now=T0 + 5)  # b reads: a delivery of each
    page = await b.store.message_page(None, 2)
    assert [m.message_id for m in page] == ["m2", "m1"]
    assert [(d.reader, d.deliveries, d.delivered_at) for d in page[0].deliveries] == [
        ("b", 1, T0 + 5)]
    rest = await b.store.message_page("m1", 2)
    assert [m.message_id for m in rest] == ["m0"] and rest[0].preview == '"' + "x" * 199
    with pytest.raises(errors.NotFound, match="the page's `before`"):
        await b.store.message_page("nosuch", 2)


async def test_ids_by_prefix(bundle):
    b = bundle
    one = await b.enqueue()
    two = await b.enqueue()
    common = next(i for i in range(len(one)) if one[i] != two[i])
    assert await b.store.id_prefix_matches("job", one, 6) == [one]
    assert await b.store.id_prefix_matches("job", one[:common + 1], 6) == [one]
    assert await b.store.id_prefix_matches("job", one[:common], 6) == sorted([one, two])
    assert await b.store.id_prefix_matches("job", one[:common], 1) == [min(one, two)]
    assert await b.store.id_prefix_matches("job", "zz", 6) == []
    assert await b.store.id_prefix_matches("workflow", one[:2], 6) == []


async def test_reply_bytes_are_sized_before_the_read_alike(bundle):
    """The reply budgets of get_job and list_jobs (coordd.net.budgets): the same sizes from
    either store, known before any value is read."""
    from coordd.store.api import JobFilter
    from coordd.store.views import LISTED_JOB_BYTES
    b = bundle
    small = await b.enqueue(payload_json='{"a":1}')
    big = await b.enqueue(payload_json='"' + "é" * 1000 + '"', kind="other")
    assert await b.store.job_reply_bytes(small) == 7
    assert await b.store.job_reply_bytes(big) == 2002  # UTF-8 bytes, not characters
    assert await b.store.job_reply_bytes("nosuch") == 0
    every = JobFilter(limit=10)
    assert await b.store.page_reply_bytes(every) == 2 * LISTED_JOB_BYTES + 2009
    assert await b.store.page_reply_bytes(JobFilter(kind="other", limit=10)) == \
        LISTED_JOB_BYTES + 2002
    assert await b.store.page_reply_bytes(JobFilter(limit=1, newest_first=True)) == \
        LISTED_JOB_BYTES + 2002
    assert await b.store.page_reply_bytes(JobFilter(limit=10, after=small)) == \
        LISTED_JOB_BYTES + 2002
    assert await b.store.page_reply_bytes(JobFilter(limit=10, after="nosuch")) == 0
