"""bench.pressure's prune scenario (issue 21, finding 6): claims while a prune deletes N
terminal jobs past retention, against claims before it on the same daemon. Loaded by
`bench.pressure.load_more`; run it with `python -m bench.pressure --only prune`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import uvloop

from bench.pressure import (
    CLAIMS, WARMUP, Row, claim_loop, fresh_daemon, preload, quantile_ms,
)
from coordd.client import Client


def prune(workdir: Path, args: argparse.Namespace) -> list[Row]:
    """Claims while a prune deletes N terminal jobs past retention (and vacuums, and
    refreshes statistics); against claims before it (same daemon)."""
    n = args.prune_jobs
    d = fresh_daemon(workdir, "prune", config="retention_s = 3600.0\nreaper_interval_s = 3600.0\n")
    t0 = time.time() - 30 * 86400.0
    load_s = preload(d.db, [(n, "a", "cpu", 2, "succeeded"),
                            (WARMUP + CLAIMS + 200_000, "b", "cpu", 1, "waiting")], t0)
    d.start()

    async def during() -> tuple[list[float], float, int]:
        stop = asyncio.Event()
        async with Client(d.socket, timeout=600.0) as c:
            claims = asyncio.create_task(claim_loop(d.socket, "w2", ["cpu"], ["b"], 10**9,
                                                    stop))
            await asyncio.sleep(0.3)
            t = time.perf_counter()
            res = await c.call("prune", {})
            took = time.perf_counter() - t
            stop.set()
            return await claims, took, res["pruned"] if isinstance(res, dict) else res.pruned

    try:
        uvloop.run(claim_loop(d.socket, "warm", ["cpu"], ["b"], WARMUP))
        before = uvloop.run(claim_loop(d.socket, "w", ["cpu"], ["b"], CLAIMS))
        lat, took, pruned = uvloop.run(during())
    finally:
        d.stop()
    note = f"pruned {pruned:,} in {took:.1f}s, {len(lat)} claims meanwhile (preload {load_s:.0f}s)"
    return [
        Row("prune", "claim p50 during a prune", quantile_ms(lat, 50), quantile_ms(before, 50),
            note=note),
        Row("prune", "claim p99 during a prune", quantile_ms(lat, 99), quantile_ms(before, 99),
            target="<= 20 ms", met=quantile_ms(lat, 99) <= 20.0),
        Row("prune", "claim max during a prune", 1e3 * max(lat), 1e3 * max(before)),
    ]


prune.pressure_rows = True  # type: ignore[attr-defined]
SCENARIOS = {"prune": prune}
