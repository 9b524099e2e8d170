"""`python -m bench.instructions`: instructions and SQL statements per claim + complete.

    python -m bench.instructions [--jobs 2000] [--rev REV ...] [--no-tree] [--statements]
                                 [--eager] [--mode cycle|heartbeat]

`--mode heartbeat`: the same figures per heartbeat of one worker that holds one job and
whose readings do not change (issue 30: a quiet beat), `--jobs` of them.

A deterministic figure for a noisy machine: one client's claim -> complete cycles run
in-process against a Coordinator (no RPC: the writer, the store and the claim path), and
valgrind's callgrind counts the instructions of the cycles only (`--toggle-collect` on
the C function `functools.reduce`, which the cycles run inside; the start, the enqueue
and the close are not counted). The same counts come back for the same code whatever
else the machine is doing. A second, plain run traces the writer connection's SQL
(`set_trace_callback`) and counts statements per job, by statement.

Each revision given with --rev is extracted to a temp folder (`git archive`, as
`bench.run --rev` does) and measured with this file, so the loop is the same for both.

    python -m bench.instructions --rpc [--jobs 300] [--rpc-clients K] [--rev REV ...]
                                 [--rpc-idle] [--keep DIR] [--cprofile DIR] [--eager]

With `--rpc` a real daemon serves the cycles over its socket instead
(bench/rpc_instructions.py): instructions per RPC, the request path included; with
`--eager` each complete asks for the next job (one request a job where the daemon has it).

The clock is a FakeClock, pinned (moving it would wake coordd's timers on every cycle, which
a real clock does not); the background checkpointer thread is off
(`wal_checkpoint_interval_s = 0`) so no other thread runs during the cycles. Python's
hash seed is pinned. With `--eager`, each complete claims the next job (`next`, eager
dispatch: one call per job instead of two) where the measured tree has it; a revision
without it runs the plain loop, and the line says so. See bench/README.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JOBS = 2000
RPC_JOBS = 300  # --rpc's default: python under callgrind serves ~100 cycles a second
TOGGLE = "functools_reduce"  # the C function the measured cycles run inside


def _child(n: int, db: str, trace_out: str | None, eager: bool = False,
           mode: str = "cycle") -> None:
    """The measured loop (run in a subprocess whose PYTHONPATH names the source): set-up,
    the cycles inside functools.reduce (what callgrind counts), then the close."""
    import asyncio
    import functools
    import random

    import uvloop

    # The checkout's editable install finds any coordd module the measured source lacks
    # (e.g. coordd.wire in --rev 9727d64) in the checkout: drop it, so a revision runs
    # only its own modules and the fallbacks below see their ImportError.
    sys.meta_path[:] = [f for f in sys.meta_path if "Editable" not in getattr(
        f, "__name__", type(f).__name__)]
    import coordd
    from coordd import config as config_mod
    from coordd.clock import FakeClock
    try:  # the packaged layout (issue 27 item 4)
        from coordd.wire.protocol import Claim, Complete, Enqueue, EnqueueBatch, Heartbeat
    except ImportError:  # revisions before it (`--rev 9727d64`): the flat layout
        from coordd.protocol import (  # type: ignore[no-redef]
            Claim, Complete, Enqueue, EnqueueBatch, Heartbeat,
        )
    from coordd.service import Coordinator
    ask = None
    if eager:
        try:
            from coordd.wire.claims import ClaimAsk
            ask = ClaimAsk(lease_s=30.0)
        except ImportError:  # a revision without eager dispatch: the plain loop
            print("eager dispatch: not in this revision", file=sys.stderr)

    print(f"coordd from {Path(coordd.__file__).parent}", file=sys.stderr)
    readings = {"memory_used_pct": 40.0, "temperature_c": 50.0, "on_battery": False,
                "user_idle_s": 3600.0}
    clock = FakeClock(1_000.0)
    cfg = config_mod.load(None, wal_checkpoint_interval_s=0.0)
    try:  # the daemon builds the SQLite store (issue 27: the coordinator names no store)
        from coordd.daemon.server import sqlite_coordinator
    except ImportError:
        sqlite_coordinator = getattr(Coordinator, "over_sqlite", None)
    if sqlite_coordinator is not None:  # one Coordinator over a store (issue 27)
        coord = sqlite_coordinator(db, cfg, clock, rng=random.Random(7))
        writer = coord.store.writer
    else:  # revisions before it: the Coordinator on a SQLite file
        coord = Coordinator(db, cfg, clock, rng=random.Random(7))
        writer = coord.writer

    beat = Heartbeat(worker_id="w1", roles=["cpu"], readings=readings)

    async def setup() -> None:
        await coord.start()
        await coord.heartbeat(beat)
        if mode == "heartbeat":  # one held job, then beats that change nothing
            await coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=2, payload={}))
            assert (await coord.claim(Claim(worker_id="w1", lease_s=3600.0))).job is not None
            await coord.heartbeat(beat)
            return
        for i in range(0, n, 500):
            await coord.enqueue_batch(EnqueueBatch(jobs=[
                Enqueue(kind="k", required_role="cpu", priority=2, payload={"i": j})
                for j in range(i, min(n, i + 500))]))

    async def cycles() -> None:
        if mode == "heartbeat":
            for _ in range(n):
                await coord.heartbeat(beat)
            return
        got = None
        for i in range(n):
            if got is None:
                got = await coord.claim(Claim(worker_id="w1", lease_s=30.0))
            assert got.job is not None, got
            if ask is None or i == n - 1:
                await coord.complete(Complete(job_id=got.job.job_id, worker_id="w1",
                                              token=got.lease.token, result={"ok": 1}))
                got = None
            else:
                got = (await coord.complete(Complete(
                    job_id=got.job.job_id, worker_id="w1", token=got.lease.token,
                    result={"ok": 1}, next=ask))).next

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(setup())
        seen: list[str] = []
        if trace_out:
            writer._conn.set_trace_callback(seen.append)
        functools.reduce(lambda _a, _b: loop.run_until_complete(cycles()), [None], None)
        if trace_out:
            writer._conn.set_trace_callback(None)
            Path(trace_out).write_text(json.dumps(seen))
    finally:
        loop.run_until_complete(coord.close())
        loop.close()


_WORDS = re.compile(r"'[^']*'|\b\d+(\.\d+)?\b")


def _shape(stmt: str) -> str:
    """A traced statement with its bound values blanked, cut to 90 characters."""
    return " ".join(_WORDS.sub("?", stmt).split())[:90]


def _rpc(args: argparse.Namespace, targets: list[str | None]) -> int:
    """`--rpc`: instructions per RPC of a real daemon (bench/rpc_instructions.py)."""
    from bench import rpc_instructions
    if not args.cprofile and shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (or use --cprofile)")
    n = args.jobs if args.jobs != DEFAULT_JOBS else RPC_JOBS
    results = []
    for rev in targets:
        src, label, tmp = source_tree(rev)
        try:
            r = rpc_instructions.measure(src, label, n, idle=args.rpc_idle,
                                         cprofile_dir=args.cprofile, keep=args.keep,
                                         k=args.rpc_clients, eager=args.eager)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        results.append(r)
        if args.cprofile:
            print(f"{label}: cProfile of the daemon over {n} cycles -> {r['profile']}")
            print("\n".join(rpc_instructions.profile_top(r["profile"])), flush=True)
            continue
        idle = f"   idle phase {r['ir_idle'] / 1e3:,.1f}k" if "ir_idle" in r else ""
        eager = f" eager ({r['rpcs_per_job']:.2f} RPC/job)" if args.eager else ""
        print(f"{label:<28} {r['clients']:>2} conn daemon Ir/job "
              f"{r['ir_per_job'] / 1e3:,.1f}k   Ir/RPC "
              f"{r['ir_per_rpc'] / 1e3:,.1f}k{idle}{eager}", flush=True)
    if len(results) > 1 and not args.cprofile:
        base = results[0]
        for r in results[1:]:
            print(f"{r['label']} / {base['label']}: Ir/RPC "
                  f"{r['ir_per_rpc'] / base['ir_per_rpc']:.3f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


def source_tree(rev: str | None) -> tuple[Path, str, Path | None]:
    """(folder on PYTHONPATH, label, temp folder to remove) for the working tree (None) or
    coordd at `rev` (also bench.parked_looks's)."""
    if rev is None:
        return ROOT, "working tree", None
    snap = Path(tempfile.mkdtemp(prefix="coordd-instr-src-"))
    archive = subprocess.run(["git", "archive", rev, "coordd"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive, check=True)
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    return snap, f"{rev} ({sha})", snap


def _run_child(src: Path, n: int, work: Path, *, callgrind: bool,
               trace_out: Path | None = None, eager: bool = False,
               mode: str = "cycle") -> int | None:
    """Run the loop for `src`; with `callgrind`, the instructions counted (Ir)."""
    db = work / f"c{os.getpid()}-{len(list(work.iterdir()))}.db"
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(n), "--db", str(db),
           "--mode", mode]
    if trace_out is not None:
        cmd += ["--trace-out", str(trace_out)]
    if eager:
        cmd.append("--eager")
    out = work / "callgrind.out"
    if callgrind:
        cmd = ["valgrind", "--tool=callgrind", f"--toggle-collect={TOGGLE}",
               f"--callgrind-out-file={out}", *cmd]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the loop failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if not callgrind:
        return None
    from bench.rpc_instructions import callgrind_total
    return callgrind_total(out)


def measure(rev: str | None, n: int, statements_only: bool, eager: bool = False,
            mode: str = "cycle") -> dict:
    """Instructions (Ir) and statements per claim + complete (per heartbeat: `mode`
    "heartbeat") for the tree or `rev`."""
    src, label, tmp = source_tree(rev)
    label += " eager" if eager else ""
    try:
        with tempfile.TemporaryDirectory(prefix="coordd-instr-") as w:
            work = Path(w)
            trace = work / "trace.json"
            _run_child(src, n, work, callgrind=False, trace_out=trace, eager=eager,
                       mode=mode)
            traced = json.loads(trace.read_text())
            # SQLite traces a statement again at the start of each trigger program it
            # runs (a TEMP trigger, a persistent one, a foreign key action), with the
            # same expanded text: those repeats are trigger runs, not statements
            stmts = [s for i, s in enumerate(traced) if i == 0 or traced[i - 1] != s]
            shapes = collections.Counter(_shape(s) for s in stmts)
            triggers = collections.Counter(_shape(s) for i, s in enumerate(traced)
                                           if i and traced[i - 1] == s)
            ir = None if statements_only else _run_child(src, n, work, callgrind=True,
                                                         eager=eager, mode=mode)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"label": label, "jobs": n, "ir_per_job": None if ir is None else ir / n,
            "statements_per_job": len(stmts) / n,
            "trigger_runs_per_job": sum(triggers.values()) / n,
            "by_statement": {k: v / n for k, v in shapes.most_common()},
            "trigger_runs_by_statement": {k: v / n for k, v in triggers.most_common()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instructions",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                   help=f"claim -> complete cycles (default {DEFAULT_JOBS})")
    p.add_argument("--rev", action="append", default=[],
                   help="also measure coordd as committed at this revision (repeatable)")
    p.add_argument("--no-tree", action="store_true", help="skip the working tree")
    p.add_argument("--rpc", action="store_true",
                   help=f"a real daemon over its socket: Ir per RPC (default --jobs {RPC_JOBS})")
    p.add_argument("--rpc-clients", type=int, default=1, metavar="K",
                   help="with --rpc: K connections, their requests sent in rounds (default 1)")
    p.add_argument("--rpc-idle", action="store_true",
                   help="with --rpc: also count the measured phase with no cycles")
    p.add_argument("--cprofile", metavar="DIR",
                   help="with --rpc: cProfile the daemon's cycles (no valgrind); top by own time")
    p.add_argument("--keep", metavar="DIR",
                   help="with --rpc: keep callgrind's output here (for callgrind_annotate)")
    p.add_argument("--statements", action="store_true",
                   help="count statements only (no valgrind run)")
    p.add_argument("--by-statement", action="store_true",
                   help="print the statements per job by statement")
    p.add_argument("--eager", action="store_true",
                   help="each complete claims the next job (eager dispatch) where it can")
    p.add_argument("--mode", choices=("cycle", "heartbeat"), default="cycle",
                   help="cycle: claim + complete (default); heartbeat: unchanged heartbeats")
    p.add_argument("--out", help="write the figures as JSON here")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    p.add_argument("--trace-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rpc or args.cprofile:  # a real daemon (bench/rpc_instructions.py)
        return _rpc(args, [*args.rev, *([] if args.no_tree else [None])])
    if args.child is not None:
        _child(args.child, args.db, args.trace_out, args.eager, args.mode)
        return 0
    if not args.statements and shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (or use --statements)")
    targets = [*args.rev, *([] if args.no_tree else [None])]
    results = []
    for rev in targets:
        r = measure(rev, args.jobs, args.statements, args.eager, args.mode)
        results.append(r)
        ir = "n/a" if r["ir_per_job"] is None else f"{r['ir_per_job'] / 1e3:,.1f}k"
        u = "beat" if args.mode == "heartbeat" else "job"
        print(f"{r['label']:<28} Ir/{u} {ir:>9}   SQL statements/{u} "
              f"{r['statements_per_job']:.2f}   trigger programs/{u} "
              f"{r['trigger_runs_per_job']:.2f}", flush=True)
        if args.by_statement:
            for shape, k in r["by_statement"].items():
                print(f"    {k:5.2f}  {shape}")
            for shape, k in r["trigger_runs_by_statement"].items():
                print(f"    {k:5.2f}  trigger program(s) run by: {shape}")
    if len(results) > 1 and all(r["ir_per_job"] for r in results):
        base = results[0]
        for r in results[1:]:
            print(f"{r['label']} / {base['label']}: Ir {r['ir_per_job'] / base['ir_per_job']:.3f}x"
                  f", statements {r['statements_per_job'] - base['statements_per_job']:+.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
