"""The worker's side of push (issue 15), against a fake coordd client: the control watch
acts once per new action and stops on unknown_method; the claim loop against an older
coordd (claims answered at once) waits claim_interval_s instead of spinning."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from coordd import errors
from coordd.clock import SystemClock
from coordd.wire.protocol import ClaimResult, HeartbeatResult
from coordd.wire.push import WorkerActions
from worker.config import from_dict
from worker.control import ControlWatch, until
from worker.supervisor import Supervisor


class FakeWatchClient:
    def __init__(self, replies: list) -> None:
        self.replies = replies
        self.seen: list[WorkerActions] = []

    async def watch_worker(self, worker_id: str, wait_s: float, seen: WorkerActions):
        self.seen.append(seen)
        if not self.replies:
            await asyncio.sleep(3600)
        r = self.replies.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


async def test_control_watch_acts_once_per_new_cancel_and_passes_seen():
    client = FakeWatchClient([WorkerActions(cancel=["j1"]), WorkerActions(cancel=["j1", "j2"])])
    acted: list[tuple[str, str]] = []
    held = {"j1": object(), "j2": object()}
    cfg = SimpleNamespace(claim_wait_s=0.001, claim_interval_s=0.001)
    watch = ControlWatch(client, "w1", cfg, SystemClock(), held=lambda: held,
                         act=lambda j, a, r: acted.append((j, a)))
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    for _ in range(200):
        await asyncio.sleep(0.005)
        if len(client.seen) >= 3:
            break
    stop.set()
    await asyncio.wait_for(task, 2)
    assert acted == [("j1", "cancel"), ("j2", "cancel")]
    assert client.seen[1].cancel == ["j1"] and client.seen[2].cancel == ["j1", "j2"]


class QueuedWatchClient:
    """Each call takes the next answer put on `answers` (parked until there is one)."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[WorkerActions] = asyncio.Queue()
        self.seen: list[WorkerActions] = []

    async def watch_worker(self, worker_id: str, wait_s: float, seen: WorkerActions):
        self.seen.append(seen)
        return await self.answers.get()


async def _calls(client, n: int) -> None:
    for _ in range(400):
        if len(client.seen) >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{len(client.seen)} watch calls, expected {n}")


async def test_a_job_started_again_is_watched_afresh_and_its_new_cancel_acted_on():
    """A job cancelled, retried and claimed again by the same worker: the watch parked
    with the old cancel in `seen` (coordd would not answer the new one) and the worker
    would skip it as known; the cancel came only with the next heartbeat. `started`
    re-parks the watch without it, and the new cancel is acted on."""
    client = QueuedWatchClient()
    acted: list[tuple[str, str]] = []
    held = {"j1": object()}
    cfg = SimpleNamespace(claim_wait_s=30, claim_interval_s=30)
    watch = ControlWatch(client, "w1", cfg, SystemClock(), held=lambda: held,
                         act=lambda j, a, r: acted.append((j, a)))
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    watch.started("j1")
    await _calls(client, 1)
    client.answers.put_nowait(WorkerActions(cancel=["j1"]))
    await _calls(client, 2)  # parked again, told of j1's cancel; j1 is still ending
    assert acted == [("j1", "cancel")] and client.seen[1].cancel == ["j1"]
    held["j1"] = object()  # that run ended; the job was retried and claimed again
    watch.started("j1")
    await _calls(client, 3)  # the call carrying the old cancel was given up
    assert client.seen[2].cancel == []
    client.answers.put_nowait(WorkerActions(cancel=["j1"]))
    await _calls(client, 4)
    assert acted == [("j1", "cancel"), ("j1", "cancel")]
    stop.set()
    await asyncio.wait_for(task, 2)


async def test_a_cancel_answered_before_its_claim_is_held_is_acted_on_when_it_starts():
    """The watch's answer can name a job whose claim the supervisor has not started yet:
    not acted on then (not held), and no pause of claim_interval_s (30 s here) may stand
    between it and the job's start: `started` asks again at once."""
    client = QueuedWatchClient()
    acted: list[tuple[str, str]] = []
    held: dict[str, object] = {"j0": object()}
    cfg = SimpleNamespace(claim_wait_s=30, claim_interval_s=30)
    watch = ControlWatch(client, "w1", cfg, SystemClock(), held=lambda: held,
                         act=lambda j, a, r: acted.append((j, a)))
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    watch.started("j0")
    await _calls(client, 1)
    client.answers.put_nowait(WorkerActions(cancel=["j2"]))  # early, j2 not held: a pause
    await asyncio.sleep(0.05)
    assert acted == [] and len(client.seen) == 1
    held["j2"] = object()
    watch.started("j2")
    await _calls(client, 2)
    assert client.seen[1].cancel == []
    client.answers.put_nowait(WorkerActions(cancel=["j2"]))
    await _calls(client, 3)
    assert acted == [("j2", "cancel")]
    stop.set()
    await asyncio.wait_for(task, 2)


async def test_control_watch_ends_on_unknown_method():
    client = FakeWatchClient([errors.UnknownMethod("unknown method 'watch_worker'")])
    cfg = SimpleNamespace(claim_wait_s=30, claim_interval_s=0.01)
    watch = ControlWatch(client, "w1", cfg, SystemClock(), held=lambda: {"j1": 1},
                         act=lambda j, a, r: None)
    await asyncio.wait_for(watch.run(asyncio.Event()), 2)
    assert watch.served is False


async def test_until_gives_the_call_up_when_stopped():
    stop = asyncio.Event()
    call = asyncio.ensure_future(asyncio.sleep(3600, result="late"))
    waiter = asyncio.ensure_future(until(stop, call))
    await asyncio.sleep(0)
    stop.set()
    assert await asyncio.wait_for(waiter, 1) is None and call.cancelled()
    assert await until(asyncio.Event(), asyncio.sleep(0, result="now")) == "now"


class OldCoordd:
    """Answers every claim at once with no job, as a coordd without wait_s does."""

    def __init__(self) -> None:
        self.claims = 0

    async def heartbeat(self, *a, **kw):
        return HeartbeatResult(now=0.0)

    async def claim(self, *a, **kw):
        self.claims += 1
        return ClaimResult()

    async def watch_worker(self, *a, **kw):
        raise errors.UnknownMethod("unknown method 'watch_worker'")

    async def goodbye(self, *a, **kw):
        return {}

    async def close(self):
        pass


async def test_claim_loop_against_an_older_coordd_polls_at_claim_interval(tmp_path):
    old = OldCoordd()
    cfg = from_dict({"claim_interval_s": 0.1, "claim_wait_s": 30,
                     "heartbeat_interval_s": 5, "work_dir": str(tmp_path)})
    probes = SimpleNamespace(read=lambda: {"memory_used_pct": 10.0})
    sup = Supervisor(lambda: old, "w1", ["cpu"], cfg, probes=probes)
    task = asyncio.create_task(sup.run())
    await asyncio.sleep(0.55)
    sup.request_stop()
    await asyncio.wait_for(task, 5)
    assert 3 <= old.claims <= 8, old.claims  # ~every 0.1 s, not a spin
