"""The index of the parked claims (coordd.service.parked.ClaimIndex): what a wake-up costs
in claims visited, counted (deterministic, no timing), with 1,000 parked claims, and that
the index hands credits out in the order a scan of every claim would (arrival order among
the claims that may take the job). Push is driven directly on a FakeClock with a stub
claim attempt; the daemon-level rules are in test_push.py and test_push_edges.py."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

from coordd.clock import FakeClock
from coordd.service.parked import ClaimIndex, ClaimWaiter
from coordd.service.push import Push

N = 1_000


class Store:
    def claims_parked(self, on: bool) -> None:
        pass


async def settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def park(push: Push, n: int, *, reasons=("gate",), roles=("r",), kinds=None):
    """`n` workers w0..w{n-1}, each with one parked claim and its roles noted; the claims'
    looks find nothing (refused by `reasons`). Returns (tasks, looks per worker)."""
    looks = {f"w{i}": 0 for i in range(n)}

    def attempt_for(worker_id: str):
        async def attempt(waited_s: float):
            looks[worker_id] += 1
            return SimpleNamespace(job=None, reasons=reasons, waited_s=waited_s)
        return attempt

    tasks = [asyncio.ensure_future(push.claim(f"w{i}", kinds, 60.0, attempt_for(f"w{i}")))
             for i in range(n)]
    await settle()
    assert push.sleeping == n
    for i in range(n):
        push.heartbeat(f"w{i}", frozenset(roles))  # roles known: each looks once more
    await settle()
    assert push.sleeping == n
    return tasks, looks


async def close(push: Push, tasks) -> None:
    await push.close()
    await asyncio.gather(*tasks)


async def test_a_heartbeat_visits_only_its_workers_parked_claim():
    push = Push(FakeClock(), Store())
    tasks, looks = await park(push, N)
    before = push._index.visits
    push.heartbeat("w500", frozenset({"r"}))  # roles unchanged, its last look gated
    assert push._index.visits - before == 1   # a scan of every claim: 1,000
    await settle()
    assert looks["w500"] == 3 and looks["w499"] == 2
    before = push._index.visits
    for i in range(N):  # one heartbeat round of the whole fleet: N visits, not N * N
        push.heartbeat(f"w{i}", frozenset({"r"}))
    assert push._index.visits - before == N
    await close(push, tasks)


async def test_a_ready_job_visits_only_the_claims_that_may_take_it_oldest_first():
    push = Push(FakeClock(), Store())
    tasks, looks = await park(push, N, reasons=())
    push.heartbeat("w0", frozenset({"other"}))  # the oldest may no longer take role r
    await settle()
    assert looks["w0"] == 3
    before = push._index.visits
    push.job_ready("r", "k", 2)
    assert push._index.visits - before == 2  # the two oldest that may take it, no more
    await settle()
    assert [w for w, n in looks.items() if n == 3] == ["w0", "w1", "w2"]
    before = push._index.visits
    push.job_ready("nobody", "k", 1)  # no claim may take it: none visited
    assert push._index.visits - before == 0
    push.job_ready("other", "k", 1)
    await settle()
    assert looks["w0"] == 4
    await close(push, tasks)


async def test_units_freed_visit_only_the_claims_a_limit_refused():
    from coordd.rules.limits import LIMIT_REFUSED
    push = Push(FakeClock(), Store())
    tasks, looks = await park(push, N)
    tasks2, looks2 = [], {"lim": 0}

    async def limited(waited_s: float):
        looks2["lim"] += 1
        return SimpleNamespace(job=None, reasons=(LIMIT_REFUSED,), waited_s=waited_s)

    tasks2.append(asyncio.ensure_future(push.claim("lim", None, 60.0, limited)))
    await settle()
    before = push._index.visits
    push.limits_changed()
    assert push._index.visits - before == 1
    await settle()
    assert looks2["lim"] == 2 and sum(looks.values()) == 2 * N
    await close(push, tasks + tasks2)


def test_the_index_gives_credits_in_the_order_a_full_scan_would():
    """Random roles, kinds and re-filings: `takers` yields exactly the claims a scan in
    arrival order would find able to take the job, in that order."""
    rng = random.Random(28)
    roles_pool, kinds_pool = ["a", "b", "c"], ["x", "y", "z"]
    for _ in range(200):
        index, roles = ClaimIndex(), {}
        claims = []
        for seq in range(rng.randrange(1, 30)):
            worker = f"w{rng.randrange(8)}"
            kinds = None if rng.random() < 0.3 else \
                frozenset(rng.sample(kinds_pool, rng.randrange(0, 3)))
            w = ClaimWaiter(None, seq, worker, kinds)
            index.add(w, roles.get(worker))
            claims.append(w)
            if rng.random() < 0.4:  # a heartbeat changes (or forgets) a worker's roles
                who = f"w{rng.randrange(8)}"
                new = None if rng.random() < 0.3 else \
                    frozenset(rng.sample(roles_pool, rng.randrange(0, 3)))
                roles[who] = new
                index.set_roles(who, new)
            if claims and rng.random() < 0.2:
                gone = claims.pop(rng.randrange(len(claims)))
                index.remove(gone)
        for role in roles_pool:
            for kind in kinds_pool:
                after = rng.randrange(-1, 30)
                want = [w.seq for w in claims if w.seq > after
                        and (w.kinds is None or kind in w.kinds)
                        and (roles.get(w.worker_id) is None or role in roles[w.worker_id])]
                assert [w.seq for w in index.takers(role, kind, after)] == want
        for w in claims:
            index.remove(w)
        assert not index.all and not index.by_worker and not index._buckets
