"""`python -m bench.drain_stores`: the drain table on both stores, through real coordd
processes, in one run.

    python -m bench.drain_stores [--jobs N] [--clients 1,16] [--rounds R] [--dsn DSN]

Each round, for each client count, on N fresh jobs: a coordd on SQLite and a coordd on
PostgreSQL (`--store`, a fresh database on a throwaway cluster with fsync on, or at
--dsn), each enqueued with `enqueue_batch` and then drained by C connections looping
claim -> complete (bench.load, the same load processes as bench.run), and the bare asyncpg
SKIP LOCKED loop (coordd.store.postgres.bare, bench.store) on the same cluster as
PostgreSQL's floor. Like for like: the cluster's durability (synchronous_commit on, fsync
on) holds for coordd's pool and the bare loop alike, and the bare loop commits as often
per job as the coordd drain does: with eager dispatch (bench.load; COORDD_BENCH_EAGER=0
turns it off) coordd commits a complete and the next claim together, so the bare loop
does too (`drain_bare(eager=True)`); without it, each statement commits alone on both.
The jobs table is ANALYZEd after the enqueue, as the bare loop's is after its fill (`--no-analyze`: drain on the statistics of the empty table, where every
claim seq-scans `jobs` until autovacuum analyzes it). One table: medians over rounds;
ratios are medians of each round's ratio. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from bench.coordd_bench import client_procs
from bench.daemon import Daemon
from bench.load import EAGER, run_phase
from bench.store import drain_bare

ENQUEUE_BATCH = 500
SQLITE, POSTGRES, BARE = "coordd on SQLite", "coordd on PostgreSQL", "bare asyncpg SKIP LOCKED loop"


def drain_daemon(workdir: Path, jobs: int, conns: int, max_procs: int, store: str = "",
                 analyze: bool = True) -> float:
    """A fresh coordd (on `store`, else SQLite in `workdir`): batch-enqueue `jobs`, drain
    them with `conns` clients; jobs/s of the drain."""
    d = Daemon(workdir, probe=False, store=store)
    workdir.mkdir(parents=True)
    d.start()
    try:
        eb = run_phase("enqueue_batch", d.socket, 2, 1, n_jobs=jobs, batch=ENQUEUE_BATCH)
        if eb.done != jobs:
            raise RuntimeError(f"enqueue_batch: {eb.done} of {jobs} acknowledged")
        if store and analyze:  # as the bare loop does after its fill (see the module doc)
            asyncio.run(_database(store, "ANALYZE jobs"))
        r = run_phase("drain", d.socket, conns, client_procs(conns, max_procs),
                      tag=f"c{conns}")
    finally:
        d.stop()
    if r.done != jobs:
        raise RuntimeError(f"drain at {conns} clients: {r.done} of {jobs}: {d.log_tail()}")
    return r.rate


async def _database(dsn: str, sql: str) -> None:
    import asyncpg
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def fresh_database(dsn: str) -> tuple[str, str]:
    """(name, DSN) of a new empty database beside `dsn`'s (a libpq URI)."""
    name = f"bench_{uuid.uuid4().hex[:10]}"
    asyncio.run(_database(dsn, f"CREATE DATABASE {name}"))
    head, _, query = dsn.partition("?")
    base = head.rsplit("/", 1)[0]
    return name, f"{base}/{name}" + (f"?{query}" if query else "")


def run(args: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    from coordd.store.postgres.throwaway import Cluster
    cluster = None
    dsn = args.dsn
    if dsn is None:
        cluster = Cluster(fsync=True)
        dsn = cluster.start()
    clients = [int(c) for c in args.clients.split(",")]
    rows: dict[str, dict[int, list[float]]] = {SQLITE: {}, POSTGRES: {}, BARE: {}}
    tmp = Path(tempfile.mkdtemp(prefix="bench-drain-stores-"))
    try:
        for rnd in range(args.rounds):
            for c in clients:
                rows[SQLITE].setdefault(c, []).append(
                    drain_daemon(tmp / f"r{rnd}c{c}-sqlite", args.jobs, c, args.client_procs))
                name, db_dsn = fresh_database(dsn)
                try:
                    rows[POSTGRES].setdefault(c, []).append(drain_daemon(
                        tmp / f"r{rnd}c{c}-pg", args.jobs, c, args.client_procs, db_dsn,
                        analyze=not args.no_analyze))
                finally:
                    asyncio.run(_database(dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                rows[BARE].setdefault(c, []).append(
                    asyncio.run(drain_bare(dsn, args.jobs, c, eager=EAGER)))
                print(f"round {rnd + 1}, {c} client(s): "
                      + ", ".join(f"{k} {v[c][-1]:,.0f}" for k, v in rows.items()),
                      file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if cluster is not None:
            cluster.stop()
    return rows


def render(rows: dict[str, dict[int, list[float]]], clients: list[int], argv: list[str]) -> str:
    """jobs/s (median over rounds) per client count; coordd on PostgreSQL also as a ratio
    to coordd on SQLite and to the bare loop of the same round (medians of the ratios)."""
    def ratio(label: str, against: str, c: int) -> float:
        return statistics.median(x / b for x, b in zip(rows[label][c], rows[against][c]))
    head = "| drain (claim + complete) | " + " | ".join(f"{c} client(s), jobs/s"
                                                       for c in clients) + " |"
    out = [f"$ python -m bench.drain_stores {' '.join(argv)}".rstrip(), "", head,
           "|---|" + "---:|" * len(clients)]
    for label, per in rows.items():
        cells = []
        for c in clients:
            cell = f"{statistics.median(per[c]):,.0f}"
            if label == POSTGRES:
                cell += (f" ({ratio(POSTGRES, SQLITE, c):.2f}x SQLite, "
                         f"{ratio(POSTGRES, BARE, c):.2f}x bare)")
            cells.append(cell)
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.drain_stores",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--clients", default="1,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--client-procs", type=int, default=2,
                   help="load processes for >1 connection (default 2)")
    p.add_argument("--no-analyze", action="store_true",
                   help="drain the PostgreSQL coordd on the planner's stale statistics of a "
                        "just-filled table (no ANALYZE after the enqueue)")
    p.add_argument("--dsn", default=None,
                   help="an existing PostgreSQL, libpq URI (default: a throwaway cluster)")
    args = p.parse_args(argv)
    rows = run(args)
    print(render(rows, [int(c) for c in args.clients.split(",")], argv))


if __name__ == "__main__":
    main()
