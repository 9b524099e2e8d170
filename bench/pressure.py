"""`python -m bench.pressure`: coordd under resource pressure, each figure beside the same
run's baseline (issue 21).

    python -m bench.pressure [--only NAME[,NAME]] [--sizes 1000,100000[,1000000]]
                             [--status-jobs N] [--prune-jobs N] [--out FILE.json]

Every scenario starts real coordd processes on fresh files and drives them over the
socket. A scenario is a function `(workdir, args) -> list[Row]` in `SCENARIOS`; other
modules add theirs (`bench/pressure_prune.py`: claims during a prune;
`bench/pressure_io.py`: file descriptors, frames, slow readers, a
full disk, overload by class) by exporting a `SCENARIOS` dict of the same shape, which
is merged here. Each Row is one figure, its baseline measured in the same run (without
the pressure), their ratio and the target. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing as mp
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import uvloop

from bench.daemon import Daemon, pct
from coordd.jsontext import dumps
from coordd.client import Client

WARMUP = 50
CLAIMS = 1000
ROUND = 100  # claims per daemon per round (claim scenarios)
PACED_ROUNDS = 5  # status_pollers: alternating rounds of claims alone / beside paced pollers
CHUNK = 100_000
READINGS = {"memory_used_pct": 10.0, "temperature_c": 40.0, "on_battery": False,
            "user_idle_s": 3600.0}
SQL_PRELOAD = (
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at, finished_at) "
    "VALUES (?, ?, ?, ?, ?, ?, 3, ?, ?, ?, ?, ?)"
)
SQL_PRELOAD_EVENT = (
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    "VALUES (?, ?, NULL, NULL, ?, 'preloaded')"
)


@dataclass
class Row:
    """One figure of the table: `value` under pressure, `baseline` without it (same run)."""

    scenario: str
    figure: str
    value: float
    baseline: float | None = None
    unit: str = "ms"
    target: str = ""  # e.g. "<= 1.2x" (of the baseline) or "<= 50 ms"
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0) or self.value != self.value:
            return None
        return self.value / self.baseline


Scenario = Callable[[Path, argparse.Namespace], list[Row]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    """Register a scenario under `name`."""
    def add(fn: Scenario) -> Scenario:
        fn.pressure_rows = True  # type: ignore[attr-defined]
        SCENARIOS[name] = fn
        return fn
    return add


# ---------------------------------------------------------------- helpers


def fresh_daemon(workdir: Path, name: str, config: str = "") -> Daemon:
    """A coordd on a new file with the real schema, stopped again (preload, then start)."""
    d = Daemon(workdir / name, probe=False, config=config)
    d.workdir.mkdir(parents=True)
    d.start()
    d.stop()
    return d


def preload(db: str, groups: list[tuple[int, str, str, int, str]], t0: float) -> float:
    """Insert jobs straight into the file, in order; each group is (n, kind, role,
    priority, status). Queued (and, for terminal ones, finished) at t0 + i ms. Returns
    seconds taken. The counters' triggers run as for any insert."""
    started = time.perf_counter()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("BEGIN IMMEDIATE")
    i = 0
    for n, kind, role, prio, status in groups:
        for lo in range(0, n, CHUNK):
            ids = range(i + lo, i + min(n, lo + CHUNK))
            fin = None if status == "waiting" else 0.0
            conn.executemany(SQL_PRELOAD, (
                (f"p{j:09x}", kind, role, prio, dumps({"i": j}), status, t0 + j * 1e-3,
                 t0 + j * 1e-3, t0 + j * 1e-3, t0 + j * 1e-3,
                 None if fin is None else t0 + j * 1e-3) for j in ids))
            conn.executemany(SQL_PRELOAD_EVENT, ((f"p{j:09x}", t0 + j * 1e-3, status)
                                                 for j in ids))
        i += n
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - started


async def claim_loop(sock: str, worker: str, roles: list[str], kinds: list[str] | None,
                     n: int, stop: asyncio.Event | None = None) -> list[float]:
    """Claim -> complete `n` times (or until `stop`); the claims' round trips (s)."""
    lat: list[float] = []
    async with Client(sock, timeout=300.0) as c:
        await c.heartbeat(worker, roles, READINGS)
        pc = time.perf_counter
        while len(lat) < n and not (stop is not None and stop.is_set()):
            t0 = pc()
            r = await c.claim(worker, kinds=kinds)
            lat.append(pc() - t0)
            if r.job is None:
                raise RuntimeError(f"nothing to claim for {worker}: {r.reasons}")
            await c.complete(r.job.job_id, worker, r.lease.token, None)
    return lat


def quantile_ms(values: list[float], q: float) -> float:
    return 1e3 * pct(values, q)


def _pollers_entry(sock: str, n: int, duration_s: float, out: Any,
                   rate: float = 0.0) -> None:
    """n connections calling `status` for duration_s: back to back (rate 0), or each at
    `rate` calls a second. Puts every call's round trip (s) on `out`."""
    async def main() -> None:
        async def one(k: int) -> list[float]:
            lat: list[float] = []
            async with Client(sock, timeout=300.0) as c:
                start = time.perf_counter()
                end = start + duration_s
                i = 0
                while time.perf_counter() < end:
                    if rate:
                        due = start + (i + k / n) / rate
                        await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    t0 = time.perf_counter()
                    await c.status()
                    lat.append(time.perf_counter() - t0)
                    i += 1
            return lat
        got = await asyncio.gather(*(one(k) for k in range(n)))
        out.put([x for g in got for x in g])
    uvloop.run(main())


def _with_pollers(sock: str, n: int, duration_s: float, rate: float,
                  claims: Callable[[], list[float]]) -> tuple[list[float], list[float]]:
    """Run `claims()` while n pollers run in a load process; (status lat, claim lat)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_pollers_entry, args=(sock, n, duration_s, q, rate), daemon=True)
    p.start()
    try:
        time.sleep(0.3)
        lat = claims()
        return q.get(timeout=duration_s + 300), lat
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()


# ---------------------------------------------------------------- finding 9


def _claims_ahead(workdir: Path, args: argparse.Namespace, name: str, foreign: tuple[str, str],
                  kinds: list[str] | None) -> list[Row]:
    """Claim p50/p99 of a worker (role cpu) whose own jobs (kind b, role cpu) wait behind
    N jobs it cannot take (`foreign` = (kind, role)), against N = 0 in the same run.

    Every size has its own daemon, all running together; the claims go round by round
    (ROUND claims on each daemon in turn), so a change in the machine's load over the run
    falls on every size alike."""
    sizes = [0, *args.sizes]
    daemons, loads = [], []
    for n in sizes:
        d = fresh_daemon(workdir, f"{name}{n}")
        loads.append(preload(d.db, [(n, *foreign, 1, "waiting"),
                                    (WARMUP + CLAIMS, "b", "cpu", 1, "waiting")],
                             time.time() - 86400.0))
        daemons.append(d)
    lat: list[list[float]] = [[] for _ in sizes]
    try:
        for d in daemons:
            d.start()
            uvloop.run(claim_loop(d.socket, "warm", ["cpu"], kinds, WARMUP))
        for _ in range(CLAIMS // ROUND):
            for i, d in enumerate(daemons):
                lat[i] += uvloop.run(claim_loop(d.socket, "w", ["cpu"], kinds, ROUND))
    finally:
        for d in daemons:
            d.stop()
    base = (quantile_ms(lat[0], 50), quantile_ms(lat[0], 99))
    rows: list[Row] = []
    for n, got, load_s in zip(sizes[1:], lat[1:], loads[1:]):
        p50, p99 = quantile_ms(got, 50), quantile_ms(got, 99)
        what = f"claim with {n:,} waiting jobs of another {'kind' if kinds else 'role'} ahead"
        rows.append(Row(name, what + " p50", p50, base[0], target="<= 1.2x",
                        met=p50 <= 1.2 * base[0], note=f"preload {load_s:.0f}s"))
        rows.append(Row(name, what + " p99", p99, base[1], target="<= 1.2x",
                        met=p99 <= 1.2 * base[1]))
    return rows


@scenario("claim_other_kind")
def claim_other_kind(workdir: Path, args: argparse.Namespace) -> list[Row]:
    """A worker of kind b behind N waiting jobs of kind a (same role)."""
    return _claims_ahead(workdir, args, "claim_other_kind", ("a", "cpu"), ["b"])


@scenario("claim_other_role")
def claim_other_role(workdir: Path, args: argparse.Namespace) -> list[Row]:
    """A worker of role cpu (no kinds named) behind N waiting jobs of role gpu."""
    return _claims_ahead(workdir, args, "claim_other_role", ("b", "gpu"), None)


# ---------------------------------------------------------------- finding 4


@scenario("status_pollers")
def status_pollers(workdir: Path, args: argparse.Namespace) -> list[Row]:
    """16 connections polling `status` on N stored jobs while one worker claims: back to
    back (how fast status answers), and at a dashboard's pace (10 calls a second each:
    what they cost the claims); against one poller alone and the claims alone."""
    n = args.status_jobs
    d = fresh_daemon(workdir, "status")
    load_s = preload(d.db, [(n, "a", "cpu", 2, "succeeded"),
                            ((2 * PACED_ROUNDS + 3) * (WARMUP + CLAIMS), "b", "cpu", 1,
                             "waiting")],
                     time.time() - 86400.0)
    d.start()

    def claims(worker: str) -> Callable[[], list[float]]:
        return lambda: uvloop.run(claim_loop(d.socket, worker, ["cpu"], ["b"], CLAIMS))

    try:
        uvloop.run(claim_loop(d.socket, "warm", ["cpu"], ["b"], WARMUP))
        one, _ = _with_pollers(d.socket, 1, 3.0, 0.0, lambda: [])
        many, busy = _with_pollers(d.socket, 16, args.poll_s, 0.0, claims("w2"))
        # the paced rows: rounds alternating claims alone and claims beside the pollers,
        # so a change in the machine's load falls on both; medians of the rounds' p99
        alone_p99, calm_p99, paced = [], [], []
        for r in range(PACED_ROUNDS):
            alone_p99.append(quantile_ms(claims(f"a{r}")(), 99))
            got, calm = _with_pollers(d.socket, 16, args.poll_s, 10.0, claims(f"c{r}"))
            paced += got
            calm_p99.append(quantile_ms(calm, 99))
    finally:
        d.stop()
    alone99, calm99 = statistics.median(alone_p99), statistics.median(calm_p99)
    ratio = statistics.median(c / a for c, a in zip(calm_p99, alone_p99))
    note = f"{n:,} jobs (preload {load_s:.0f}s)"
    return [
        Row("status_pollers", "status p50, 16 pollers back to back", quantile_ms(many, 50),
            quantile_ms(one, 50), note=note),
        Row("status_pollers", "status p99, 16 pollers back to back", quantile_ms(many, 99),
            quantile_ms(one, 99), target="<= 50 ms", met=quantile_ms(many, 99) <= 50.0),
        Row("status_pollers", "status answers/s, 16 pollers back to back",
            len(many) / args.poll_s, len(one) / 3.0, unit="/s"),
        Row("status_pollers", "claim p99 beside 16 pollers back to back", quantile_ms(busy, 99),
            alone99, note="coordd's one core shared with ~all the pollers can send"),
        Row("status_pollers", "status p99, 16 pollers at 10/s each", quantile_ms(paced, 99),
            quantile_ms(one, 99), target="<= 50 ms", met=quantile_ms(paced, 99) <= 50.0),
        Row("status_pollers", "claim p99 beside 16 pollers at 10/s each", calm99,
            alone99, target="unchanged (<= 1.2x)", met=ratio <= 1.2,
            note=f"median of {PACED_ROUNDS} alternating rounds; median ratio {ratio:.2f}x "
                 f"(rounds {', '.join(f'{c / a:.2f}' for c, a in zip(calm_p99, alone_p99))})"),
    ]


# ---------------------------------------------------------------- running


def load_more(modules: tuple[str, ...] = ("bench.pressure_prune", "bench.pressure_io")
              ) -> list[str]:
    """Add the scenarios of other bench modules that exist; return their names.

    A module's `SCENARIOS` maps a name to a function: either of this module's shape
    (`(workdir, args) -> list[Row]`, marked by being registered with `@scenario`), or
    `fn(src_tree) -> dict of figures` (bench/pressure_io.py), whose figures become rows
    (its own baseline is a run against another revision: `python -m bench.pressure_io
    --baseline REV`).
    """
    found = []
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        for key, fn in getattr(mod, "SCENARIOS", {}).items():
            if key not in SCENARIOS:
                SCENARIOS[key] = fn if getattr(fn, "pressure_rows", False) else _figures(key, fn)
        found.append(name)
    return found


def _figures(name: str, fn: Callable[..., dict[str, Any]]) -> Scenario:
    """A scenario from a function that takes the source tree and returns figures."""
    def run(workdir: Path, args: argparse.Namespace) -> list[Row]:
        fig = fn(Path(__file__).resolve().parent.parent)
        rows = []
        for key, value in fig.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append(Row(name, key, float(value), unit=""))
            else:
                rows.append(Row(name, key, float("nan"), unit="", note=str(value)[:80]))
        return rows
    return run


def table(rows: list[Row]) -> str:
    """The figures as one plain-text table."""
    head = ("scenario", "figure", "value", "baseline", "ratio", "target", "met", "note")
    lines = []
    for r in rows:
        ratio = r.ratio
        lines.append((r.scenario, r.figure, f"{r.value:,.3f} {r.unit}",
                      "-" if r.baseline is None else f"{r.baseline:,.3f} {r.unit}",
                      "-" if ratio is None else f"{ratio:.2f}x", r.target,
                      {None: "", True: "MET", False: "NOT MET"}[r.met], r.note))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*line) for line in lines])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.pressure",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated scenario names (default: all)")
    p.add_argument("--sizes", default="1000,100000",
                   help="jobs ahead for the claim scenarios (default 1000,100000; add 1000000)")
    p.add_argument("--status-jobs", type=int, default=1_000_000,
                   help="jobs stored for status_pollers (default 1000000)")
    p.add_argument("--poll-s", type=float, default=5.0, help="seconds the 16 pollers run")
    p.add_argument("--prune-jobs", type=int, default=350_000,
                   help="terminal jobs the prune deletes (default 350000)")
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    args = p.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the chosen scenarios and print one table."""
    args = parse_args(argv)
    load_more()
    names = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="coordd-pressure-"))
    rows: list[Row] = []
    started = time.perf_counter()
    for name in names:
        t = time.perf_counter()
        try:
            got = SCENARIOS[name](work / name, args)
        except Exception as exc:  # one scenario falling over is a row, not the end
            got = [Row(name, "error", float("nan"), unit="", met=False,
                       note=f"{type(exc).__name__}: {exc}"[:120])]
        rows.extend(got)
        print(f"== {name} ({time.perf_counter() - t:.0f}s)", flush=True)
        print(table(got), flush=True)
    print(f"\n== all ({time.perf_counter() - started:.0f}s)")
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps([{**asdict(r), "ratio": r.ratio} for r in rows],
                                             indent=2))
    if not args.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work folder kept: {work}")
    return 0 if all(r.met is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
