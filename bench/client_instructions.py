"""`python -m bench.client_instructions`: instructions per job of the client library's side
of a one-client drain (issue 30: the client shares the 2 cores with coordd).

A plain coordd of the working tree serves a Unix socket (the same daemon for every
target, so only the client differs); N + WARMUP jobs are batch-enqueued. A child process
under callgrind imports `coordd.client` of the target (the working tree or `--rev REV`,
extracted as bench.instructions does), sends a heartbeat, drains WARMUP jobs, then drains
N more inside `functools.reduce` (`--toggle-collect`): only those cycles are counted,
everything the client process does for them (encoding, the loop, the socket calls'
user-space side, decoding) and not the kernel's side. The drain is bench.load's (eager
dispatch where the client library has it; a claim per job otherwise).

    python -m bench.client_instructions --rev 9727d64 --rev main   # and the working tree
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 50
DEFAULT_JOBS = 1000


def _child(sock: str, n: int) -> None:
    """Under callgrind: drain WARMUP jobs, then `n` inside functools.reduce; print the
    counted calls as JSON."""
    import asyncio

    import uvloop
    # the checkout's editable install must not lend a revision the modules it lacks
    sys.meta_path[:] = [f for f in sys.meta_path if "Editable" not in getattr(
        f, "__name__", type(f).__name__)]
    from bench.load import READINGS, ROLES, _drain
    from coordd.client import Client

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        c = Client(sock, timeout=300)
        runner.run(c.connect())
        runner.run(c.heartbeat("w1", ROLES, READINGS))
        runner.run(_drain(c, "w1", WARMUP))
        got = functools.reduce(lambda _acc, _x: runner.run(_drain(c, "w1", n)), [0], None)
        runner.run(c.close())
    print(json.dumps({"jobs": got[0], "rpcs": got[3]}))


def measure(rev: str | None, n: int) -> dict:
    """Client instructions (Ir) per job and per call for the tree or `rev`."""
    from bench.daemon import Daemon
    from bench.instructions import source_tree
    from bench.load import run_phase
    from bench.rpc_instructions import callgrind_total

    src, label, tmp = source_tree(rev)
    try:
        with tempfile.TemporaryDirectory(prefix="coordd-client-instr-") as w:
            work = Path(w)
            d = Daemon(work / "d", probe=False)
            d.workdir.mkdir()
            d.start()
            try:
                run_phase("enqueue_batch", d.socket, 1, 1, n_jobs=n + 2 * WARMUP, batch=500)
                out = work / "callgrind.out"
                env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}",
                       "PYTHONHASHSEED": "0"}
                proc = subprocess.run(
                    ["valgrind", "--tool=callgrind", "--toggle-collect=functools_reduce",
                     f"--callgrind-out-file={out}", sys.executable, "-m",
                     "bench.client_instructions", "--child", d.socket, "--jobs", str(n)],
                    cwd=work, env=env, capture_output=True, text=True)
            finally:
                d.stop()
            if proc.returncode != 0:
                raise SystemExit(f"the client failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            ir = callgrind_total(out)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"label": label, "jobs": got["jobs"], "rpcs_per_job": got["rpcs"] / got["jobs"],
            "ir_per_job": ir / got["jobs"], "ir_per_rpc": ir / got["rpcs"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.client_instructions",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="jobs counted (default 1000)")
    p.add_argument("--rev", action="append", default=[],
                   help="also measure the client library at this git revision (repeatable)")
    p.add_argument("--no-tree", action="store_true", help="skip the working tree")
    p.add_argument("--out", help="write the figures as JSON here")
    p.add_argument("--child", metavar="SOCKET", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child, args.jobs)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    targets: list[str | None] = [*args.rev, *([] if args.no_tree else [None])]
    results = []
    for rev in targets:
        r = measure(rev, args.jobs)
        results.append(r)
        print(f"{r['label']:<28} client Ir/job {r['ir_per_job'] / 1e3:,.1f}k   Ir/RPC "
              f"{r['ir_per_rpc'] / 1e3:,.1f}k   ({r['rpcs_per_job']:.2f} RPC/job)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
