"""The worker's side of eager dispatch (worker.claiming, worker.reports): how many jobs a
claim asks for, when a report asks for the next job and for which kinds, and a report
whose reply was lost claiming again with the same claim_id."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace
from typing import Any

from coordd import errors
from coordd.client import Disconnected
from coordd.clock import SystemClock
from coordd.wire.protocol import ClaimedJob, ClaimResult, CompleteResult, LeaseGrant
from worker.config import from_dict
from worker.jobrun import JobRun
from worker.reports import Reporter
from worker.supervisor import Supervisor


class Idle:
    async def close(self) -> None:
        pass


def supervisor(tmp_path: Any) -> Supervisor:
    argv = {"argv": ["true"]}
    cfg = from_dict({"work_dir": str(tmp_path),
                     "kinds": {"a": {**argv, "slots": 2}, "b": {**argv, "slots": 1}}})
    return Supervisor(Idle, "w1", ["cpu"], cfg,
                      probes=SimpleNamespace(read=lambda: {}))  # type: ignore[arg-type]


def hold(sup: Supervisor, job_id: str, kind: str) -> JobRun:
    run = JobRun(job=ClaimedJob(job_id=job_id, kind=kind, required_role="cpu", priority=2,
                                payload={}, attempts=1),
                 token=1, deadline=1e12, dir="/nonexistent", kind=sup.config.kinds[kind])
    sup._runs[job_id] = run
    return run


async def test_a_claim_asks_for_no_more_jobs_than_any_named_kind_has_free(tmp_path):
    sup = supervisor(tmp_path)
    assert sup._free_slots(["a", "b"]) == 1 and sup._free_slots(["a"]) == 2
    hold(sup, "j1", "a")
    assert sup._claimable() == ["a", "b"] and sup._free_slots(["a", "b"]) == 1
    hold(sup, "j2", "b")
    assert sup._claimable() == ["a"] and sup._free_slots(["a"]) == 1


async def test_a_report_asks_for_the_next_job_only_when_the_worker_was_full(tmp_path):
    sup = supervisor(tmp_path)
    a1 = hold(sup, "j1", "a")
    assert sup.next_ask(a1) is None  # not full: the claim loop has a claim out
    hold(sup, "j2", "a")
    b = hold(sup, "j3", "b")
    ask = sup.next_ask(b)  # full: the ended job's kind, one job
    assert ask is not None and ask.kinds == ["b"] and ask.max_jobs == 1 and ask.claim_id
    ask = sup.next_ask(a1)
    assert ask is not None and ask.kinds == ["a"] and ask.max_jobs == 1
    sup.request_stop()
    assert sup.next_ask(b) is None  # stopping: nothing more


class Eager:
    def __init__(self) -> None:
        self.taken: list[tuple[Any, bool]] = []

    def next_ask(self, run: JobRun) -> Any:
        return SimpleNamespace(claim_id="c1")

    async def take_next(self, run: JobRun, ask: Any, res: Any, sent: float,
                        replay: bool) -> None:
        self.taken.append((res, replay))


class LossyClient:
    """complete: the first reply is lost (it was stored), the resend answers
    already_completed."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def complete(self, job_id: str, worker_id: str, token: int, **kw: Any) -> Any:
        self.calls.append(kw)
        if len(self.calls) == 1:
            raise Disconnected("reply lost")
        raise errors.AlreadyCompleted("stored")


async def test_a_lost_reports_next_claim_is_claimed_again_by_its_claim_id(tmp_path):
    sup = supervisor(tmp_path)
    run = hold(sup, "j1", "a")
    eager, client = Eager(), LossyClient()
    reports = Reporter(client, "w1", SystemClock(), asyncio.Event(),  # type: ignore[arg-type]
                       eager=eager)
    await reports.complete(run, ({"ok": 1}, None))
    assert [c["next"].claim_id for c in client.calls] == ["c1", "c1"]
    assert eager.taken == [(None, True)]  # replayed: the lease it was granted, if any


async def test_a_reports_next_job_is_handed_to_the_claim_loop(tmp_path):
    sup = supervisor(tmp_path)
    run = hold(sup, "j1", "a")
    eager = Eager()
    nxt = ClaimResult()

    class Client:
        async def complete(self, *a: Any, **kw: Any) -> Any:
            return CompleteResult(next=nxt)
    reports = Reporter(Client(), "w1", SystemClock(), asyncio.Event(),  # type: ignore[arg-type]
                       eager=eager)
    await reports.complete(run, ({"ok": 1}, None))
    assert eager.taken == [(nxt, False)]


async def test_a_reports_next_job_takes_the_ended_runs_slot_at_once(tmp_path):
    # the ended run stays in the worker's table until its task's last steps: the job its
    # report brought must not wait for its slot, and the other full runs' reports must
    # still ask for their next job meanwhile (else each of them falls back to a claim)
    sup = supervisor(tmp_path)
    a1, a2, _ = hold(sup, "j1", "a"), hold(sup, "j2", "a"), hold(sup, "j3", "b")
    assert await sup._slots.acquire(a1, 2) and await sup._slots.acquire(a2, 2)
    ask = sup.next_ask(a1)
    assert ask is not None
    started: list[JobRun] = []
    sup._start_job = lambda run: (started.append(run), sup._runs.__setitem__(run.job_id, run))
    job = ClaimedJob(job_id="j4", kind="a", required_role="cpu", priority=2, payload={},
                     attempts=1)
    a1.finished.set()  # (the report's reply ends the lease)
    await sup.take_next(a1, ask, ClaimResult(job=job, lease=LeaseGrant(
        token=7, expires_at=1e12, lease_s=60.0)), 0.0, replay=False)
    assert [r.job_id for r in started] == ["j4"] and "j1" in sup._runs
    take = asyncio.ensure_future(sup._slots.acquire(started[0], 2))
    await asyncio.sleep(0)
    assert take.done() and take.result()  # the slot j1 held, not a wait for j1's end
    ask = sup.next_ask(a2)
    assert ask is not None and ask.kinds == ["a"] and ask.max_jobs == 1
    sup._slots.release(a1)  # j1's task ends: its slot is not given back twice
    j5 = hold(sup, "j5", "a")
    wait = asyncio.ensure_future(sup._slots.acquire(j5, 2))
    await asyncio.sleep(0)
    assert not wait.done() and j5.waiting_for_slot  # j2 and j4 hold both slots of a
    j5.aborted.set()
    assert await wait is False


async def test_a_report_stored_under_an_unavailable_reply_claims_its_next_job_again(tmp_path):
    """PostgreSQL answers `unavailable` when the connection is lost at the commit (the
    report and its next claim may have been stored): the resend's already_completed then
    says they were, and the next claim is replayed by its claim id (else the lease it
    granted is left until the reaper, an attempt of that job spent)."""
    sup = supervisor(tmp_path)
    run = hold(sup, "j1", "a")
    eager = Eager()

    class Client:
        calls = 0

        async def complete(self, *a: Any, **kw: Any) -> Any:
            Client.calls += 1
            if Client.calls == 1:
                raise errors.Unavailable("connection lost at the commit")
            raise errors.AlreadyCompleted("stored")
    clock = SystemClock()
    reports = Reporter(Client(), "w1", clock, asyncio.Event(),  # type: ignore[arg-type]
                       eager=eager)
    await reports.complete(run, ({"ok": 1}, None))
    assert Client.calls == 2 and eager.taken == [(None, True)]


async def test_a_reported_runs_folder_stays_when_its_next_claim_handed_the_job_back(tmp_path):
    # a result its schema refused, no backoff: the job waits again and the report's next
    # claim may hand it back to this worker; the ended run must not remove the folder its
    # new run is setting up (same job id, same folder)
    sup = supervisor(tmp_path)
    old = hold(sup, "j1", "a")
    old.dir = str(tmp_path / "j1")
    os.makedirs(old.dir)
    again = JobRun(job=old.job, token=2, deadline=1e12, dir=old.dir, kind=old.kind)
    sup._runs["j1"] = again  # (take_next started it before the report returned)
    await sup._tidy(old)
    assert os.path.isdir(old.dir)
    del sup._runs["j1"]  # no new run of it: the folder goes
    await sup._tidy(old)
    assert not os.path.exists(old.dir)
    os.makedirs(old.dir)
    sup._runs["j1"] = old
    await sup._tidy(old)
    assert not os.path.exists(old.dir)
