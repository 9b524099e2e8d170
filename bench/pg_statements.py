"""`python -m bench.pg_statements`: statements (round trips) PostgreSQL serves per job of a
coordd drain, counted in the server's own log (deterministic; no timing).

    python -m bench.pg_statements [--jobs 2000] [--clients 1,16]

For each client count: a throwaway cluster logging every statement (`log_statement=all`),
a coordd on a fresh database of it, `--jobs` jobs enqueued with `enqueue_batch`, then
drained by the clients' claim -> complete loops (bench.load, as bench.drain_stores does).
Counts what the server executed during the drain (its log lines `statement:` and
`execute`: one per round trip of asyncpg's extended protocol, BEGIN and COMMIT included)
and prints them per job, the most frequent statements first. The reaper and the other
periodic rounds of coordd run meanwhile and are counted too (their share shrinks with
--jobs).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import sys
import tempfile
from pathlib import Path

from bench.coordd_bench import client_procs
from bench.daemon import Daemon
from bench.drain_stores import ENQUEUE_BATCH, _database, fresh_database
from bench.load import run_phase

STATEMENT = re.compile(r"LOG:  (?:statement|execute [^:]*): (.*)")
LITERALS = re.compile(r"\$\d+|'[^']*'|\b\d+\b")


def _counted(log: Path, start: int) -> collections.Counter[str]:
    with open(log, errors="replace") as f:
        f.seek(start)
        text = f.read()
    return collections.Counter(LITERALS.sub("?", m)[:90] for m in STATEMENT.findall(text))


def measure(dsn: str, log: Path, workdir: Path, jobs: int, clients: int
            ) -> collections.Counter[str]:
    """The statements of one drain of `jobs` by `clients`, on a fresh database."""
    name, db_dsn = fresh_database(dsn)
    d = Daemon(workdir, probe=False, store=db_dsn)
    workdir.mkdir(parents=True)
    d.start()
    try:
        eb = run_phase("enqueue_batch", d.socket, 1, 1, n_jobs=jobs, batch=ENQUEUE_BATCH)
        assert eb.done == jobs, eb
        asyncio.run(_database(db_dsn, "ANALYZE jobs"))
        start = log.stat().st_size
        r = run_phase("drain", d.socket, clients, client_procs(clients, 2), tag=f"c{clients}")
        assert r.done == jobs, (r.done, d.log_tail())
        counts = _counted(log, start)
    finally:
        d.stop()
        asyncio.run(_database(dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    return counts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pg_statements",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--clients", default="1,16")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    from coordd.store.postgres.throwaway import Cluster
    cluster = Cluster(fsync=True)
    dsn = cluster.start()
    log = Path(cluster.root) / "server.log"
    asyncio.run(_database(dsn, "ALTER SYSTEM SET log_statement = 'all'"))
    asyncio.run(_database(dsn, "SELECT pg_reload_conf()"))
    tmp = Path(tempfile.mkdtemp(prefix="bench-pg-statements-"))
    try:
        for c in (int(x) for x in args.clients.split(",")):
            counts = measure(dsn, log, tmp / f"c{c}", args.jobs, c)
            total = sum(counts.values())
            print(f"{c} client(s), {args.jobs} jobs: {total / args.jobs:.2f} statements "
                  "per job")
            for text, n in counts.most_common(args.top):
                print(f"  {n / args.jobs:6.3f}  {text}")
    finally:
        cluster.stop()
    print(f"$ python -m bench.pg_statements {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
