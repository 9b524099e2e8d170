"""Drain with every job naming one fleet-wide limit against the same drain without limits.

`python -m bench.limits --jobs 8000 --rounds 3 --clients 16`: per round, two fresh coordd
processes drain N batch-enqueued jobs with C clients: one with no limits configured, one
with `[limits.bench]` (a concurrency that never throttles, so the cost measured is the
limit work itself: the candidate's limits looked up, the units held summed, the hold
written with the lease and freed by the lease-end trigger) and every job naming it. The
two alternate within a round (same machine state), with a third: the limit configured
and no job naming it (the cost a job naming none pays); the ratio of medians is the figure
(issue 17: >= 0.9x). Then the claim's own cost without the RPC around it
(bench/limits_store.py). bench/README.md has the method.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench import coordd_bench, daemon, load
from bench.limits_store import store_costs

LIMIT_CONFIG = "[limits.bench]\nconcurrency = {concurrency}\n{rate}"


@contextlib.contextmanager
def _jobs_naming(limits: list[str] | None, config: str) -> Iterator[None]:
    """Enqueued jobs name `limits` and daemons start with `config` (the load processes are
    forked, so they take the module's JOB as it is here)."""
    job, cfg = load.JOB, daemon.BENCH_CONFIG
    load.JOB = {**job, "limits": limits} if limits is not None else job
    daemon.BENCH_CONFIG = cfg + config
    try:
        yield
    finally:
        load.JOB, daemon.BENCH_CONFIG = job, cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__)
    p.add_argument("--jobs", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--client-procs", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=1000,
                   help="the limit's concurrency (default 1000: never reached)")
    p.add_argument("--rate", default=None, help="also a rate on the limit, e.g. 1000000/min")
    p.add_argument("--store-jobs", type=int, default=4000,
                   help="jobs per in-process store measurement (0: skip it)")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    rate = f'rate = "{args.rate}"\n' if args.rate else ""
    config = LIMIT_CONFIG.format(concurrency=args.concurrency, rate=rate)
    runs: dict[str, list[dict]] = {"plain": [], "limited": [], "unnamed": []}
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        for i in range(args.rounds):
            order = ("plain", "limited", "unnamed")
            for what in order[i % 3:] + order[:i % 3]:
                work = Path(tmp) / f"r{i}-{what}"
                work.mkdir()
                with _jobs_naming(["bench"] if what == "limited" else None,
                                  "" if what == "plain" else config):
                    d = coordd_bench.drain(work, args.jobs, args.clients, args.client_procs,
                                           True, None)
                runs[what].append(d)
                print(f"round {i + 1} {what:8s}: {d['jobs_s']:8.0f} jobs/s  claim p50 "
                      f"{d['claim_ms_p50']:.2f} ms  coordd cpu {d['coordd_cpu_s']:.1f}s",
                      flush=True)
    med = {k: statistics.median(r["jobs_s"] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["coordd_cpu_s"] / args.jobs * 1e6 for r in v)
           for k, v in runs.items()}
    ratio = med["limited"] / med["plain"]
    print(f"\nmedian drain at {args.clients} clients, N={args.jobs}: no limits "
          f"{med['plain']:.0f} jobs/s, every job naming one limit {med['limited']:.0f} jobs/s"
          f" = {ratio:.2f}x (target >= 0.9x); the limit configured, jobs naming none "
          f"{med['unnamed']:.0f} jobs/s = {med['unnamed'] / med['plain']:.2f}x; coordd CPU "
          f"per job {cpu['plain']:.0f} / {cpu['limited']:.0f} / {cpu['unnamed']:.0f} us")
    store = store_costs(args.store_jobs, max(3, args.rounds)) if args.store_jobs else {}
    if store:
        print("in-process claim+complete (store only, no RPC), CPU us per job, median: "
              + ", ".join(f"{k} {v:.1f}" for k, v in store.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": runs, "median_jobs_s": med,
                                              "coordd_cpu_us_per_job": cpu, "ratio": ratio,
                                              "store_cpu_us_per_job": store,
                                              "args": vars(args)}, indent=2))
    return 0 if ratio >= 0.9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
