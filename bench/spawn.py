"""What a model's spawn costs the worker's loop: uvloop's subprocess against worker.child.

    python -m bench.spawn [--samples 60] [--rounds 2]

In one uvloop process with the worker's modules imported (so the interpreter forked is the
worker's size), bench/supervisor.py's model (exits at once) is started and waited for,
one at a time, four ways: `asyncio.create_subprocess_exec` (uvloop: fork, its at-fork
handlers, exec) and `worker.child.spawn` (vfork + exec, exit through a pidfd), each for the
model's argv as it is and under `setpriv --pdeathsig KILL` (as worker.launch starts it).
Per spawn, p50 in ms: **call** = the spawn call until it returns (the loop's thread is
held that long), **exit** = the spawn call until the exit is reaped. The ways alternate
within each round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time

import uvloop

import worker.supervisor  # noqa: F401  (the worker's modules, for the forked image's size)
from bench.daemon import pct
from bench.supervisor import model_argv
from worker import child, launch


async def _uvloop_spawn(argv: list[str], env: dict[str, str], cwd: str, out: int):
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=cwd, env=env,
        start_new_session=True)
    return proc


async def _child_spawn(argv: list[str], env: dict[str, str], cwd: str, out: int):
    return child.spawn(argv, env=env, cwd=cwd, stdout=out, stderr=out)


async def one_way(spawner, argv: list[str], env: dict[str, str], cwd: str, n: int) -> dict:
    """p50 of the spawn call and of spawn -> reaped exit over `n` spawns, in ms."""
    call, done = [], []
    out = os.open(os.path.join(cwd, "out.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            proc = await spawner(argv, env, cwd, out)
            t1 = time.perf_counter()
            if await proc.wait() != 0:
                raise RuntimeError(f"the model exited {proc.returncode}")
            call.append(t1 - t0)
            done.append(time.perf_counter() - t0)
    finally:
        os.close(out)
    return {"call_ms": 1e3 * pct(call, 50), "exit_ms": 1e3 * pct(done, 50)}


async def run(samples: int, rounds: int) -> dict[str, list[dict]]:
    with tempfile.TemporaryDirectory(prefix="coordd-bench-spawn-") as cwd:
        env = {**os.environ, "COORD_RESULT": os.path.join(cwd, "result.json")}
        argv = model_argv()
        ways = {"uvloop": (_uvloop_spawn, argv), "child": (_child_spawn, argv)}
        under = launch.fast_argv(argv, env)
        if under is not None:
            ways |= {"uvloop+setpriv": (_uvloop_spawn, under),
                     "child+setpriv": (_child_spawn, under)}
        out: dict[str, list[dict]] = {name: [] for name in ways}
        for _ in range(rounds):
            for name, (spawner, args) in ways.items():
                out[name].append(await one_way(spawner, args, env, cwd, samples))
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=60, help="spawns a way a round (default 60)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    args = ap.parse_args(argv)
    result = uvloop.run(run(args.samples, args.rounds))
    print(f"spawn -> return (call) and spawn -> reaped exit, p50 ms, medians of {args.rounds}"
          f" rounds of {args.samples}:")
    for name, rows in result.items():
        call = statistics.median(r["call_ms"] for r in rows)
        done = statistics.median(r["exit_ms"] for r in rows)
        print(f"  {name:16s} call {call:6.2f}  exit {done:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
