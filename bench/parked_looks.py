"""Claim looks that one job of another role costs with N parked claims (issues 28, 30):
deterministic, one process, no timing.

    python -m bench.parked_looks [--parked 1000] [--rev REV ...] [--no-tree]

A Coordinator over a SQLite file on a pinned clock (FakeClock): `--parked` workers of role
cpu heartbeat and each parks a claim (wait_s 300); each heartbeats again, unchanged (a
quiet beat where the revision has them); one job of role gpu is enqueued, and the claim
looks that follow are counted (`coordd_claim_refusals_total{reason="no_matching_role"}`:
each look finds only the gpu job) once the loop has run idle. None should look. Each
--rev is extracted with `git archive` and run with this file, as bench.instructions does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COOL = {"memory_used_pct": 40.0, "temperature_c": 50.0, "on_battery": False,
        "user_idle_s": 3600.0}


def _coordinator(path: str) -> Any:
    """A Coordinator over a SQLite file on a FakeClock, in this revision's layout."""
    from coordd import config as config_mod
    from coordd.clock import FakeClock
    cfg, clock = config_mod.load(None), FakeClock(100.0)
    try:
        from coordd.daemon.server import sqlite_coordinator
    except ImportError:  # revisions before the layout (`--rev 9727d64`: over a path)
        from coordd.service import Coordinator
        build = getattr(Coordinator, "over_sqlite", Coordinator)
        return build(path, cfg, clock, rng=random.Random(7))
    return sqlite_coordinator(path, cfg, clock, rng=random.Random(7))


async def _measure(n: int, db: str) -> int:
    try:
        from coordd.wire.protocol import Claim, Enqueue, Heartbeat
    except ImportError:
        from coordd.protocol import Claim, Enqueue, Heartbeat  # type: ignore[no-redef]
    c = _coordinator(db)
    await c.start()

    def looks() -> float:
        return c.meters.registry.get_sample_value(
            "coordd_claim_refusals_total", {"reason": "no_matching_role"}) or 0.0

    async def beat(w: str) -> None:
        await c.heartbeat(Heartbeat(worker_id=w, roles=["cpu"], readings=COOL))

    for i in range(n):
        await beat(f"w{i}")
    parked = [asyncio.ensure_future(c.claim(Claim(worker_id=f"w{i}", wait_s=300.0)))
              for i in range(n)]
    while c.push.sleeping < n:
        await asyncio.sleep(0.01)
    for i in range(n):
        await beat(f"w{i}")
    await asyncio.sleep(0.05)  # a stored beat may wake its claims once: all asleep again
    while c.push.sleeping < n:
        await asyncio.sleep(0.01)
    before = looks()
    await c.enqueue(Enqueue(kind="k", required_role="gpu", priority=3, payload={}))
    still = 0
    while still < 20:  # the woken claims pass the credit on, one look after another
        seen = looks()
        await asyncio.sleep(0.01)
        still = still + 1 if looks() == seen else 0
    for t in parked:
        t.cancel()
    await asyncio.gather(*parked, return_exceptions=True)
    await c.close()
    return int(looks() - before)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.parked_looks",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--parked", type=int, default=1000)
    ap.add_argument("--rev", action="append", default=[], help="also measure this revision")
    ap.add_argument("--no-tree", action="store_true", help="skip the working tree")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            print(asyncio.run(_measure(args.parked, str(Path(tmp) / "c.db"))))
        return 0
    from bench.instructions import source_tree  # (not in the child: it runs as a script)
    targets: list[str | None] = [*args.rev, *([] if args.no_tree else [None])]
    for rev in targets:
        src, label, tmp = source_tree(rev)
        try:
            env = {**os.environ, "PYTHONPATH": str(src)}
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                                   "--parked", str(args.parked)], env=env,
                                  cwd=tempfile.gettempdir(), capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{label} failed:\n{proc.stderr[-3000:]}")
            print(f"{label}: {args.parked} parked claims of role cpu, one gpu job: "
                  f"{proc.stdout.strip()} claim looks")
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
