"""`python -m bench.run`: coordd against bare SQLite and huey, side by side, round by round.

    python -m bench.run [--jobs N] [--rounds R] [--clients 1,4,16,64] [--quick]
                        [--client-procs P] [--scale [--scale-max 1000000]]
                        [--profile DIR] [--plain-daemon] [--out FILE.json]
                        [--supervisor [--supervisor-jobs 500]]

Each round measures, on the same N jobs: the bare-SQLite per-op loop, huey (SqliteHuey,
2-thread consumer), and a real coordd process (enqueue per request, enqueue_batch, and a
drain per client count on a fresh daemon), and with --supervisor one coord-worker slot
against bare process spawns (bench/supervisor.py). Every coordd figure is printed as a ratio to
the baselines of the same round; the final table holds medians over rounds (ratios are
medians of the per-round ratios). The full default run (N=20000, 3 rounds, 1/4/16/64
clients) takes several minutes on 2 cores. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

# bench modules that import coordd are imported in main(), after the optional re-exec
# onto a snapshot (--rev), so a half-edited working tree is never imported.

DEFAULT_N = 20_000
QUICK_N = 2_000
DEFAULT_ROUNDS = 3
DEFAULT_CLIENTS = "1,4,16,64"
TARGETS = {"drain16_vs_bare": 1.0, "drain16_vs_bare_aim": 1.5, "drain16_vs_huey": 4.0,
           "claim16_p99_ms": 5.0, "enqueue_batch_jobs_s": 40_000.0,
           "scale_p50_1m_vs_1k": 1.2, "scale_rss_1m_mb": 100.0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, help=f"jobs per measurement (default {DEFAULT_N}, "
                                            f"{QUICK_N} with --quick)")
    p.add_argument("--rounds", type=int, help=f"rounds (default {DEFAULT_ROUNDS}, 1 with --quick)")
    p.add_argument("--clients", default=None,
                   help=f"drain client counts (default {DEFAULT_CLIENTS}; 1,4,16 with --quick)")
    p.add_argument("--client-procs", type=int, default=2,
                   help="load processes for >1 connection (default 2)")
    p.add_argument("--quick", action="store_true", help="smoke run: small N, one round")
    p.add_argument("--no-huey", action="store_true", help="skip the huey baseline")
    p.add_argument("--plain-daemon", action="store_true",
                   help="run `python -m coordd` without the writer probe (no writer figures)")
    p.add_argument("--profile", metavar="DIR",
                   help="py-spy the daemon during round 1's largest drain; raw stacks in DIR")
    p.add_argument("--scale", action="store_true", help="also run the scale points")
    p.add_argument("--scale-max", type=int, default=100_000,
                   help="largest scale point (1000000 for the 1M point; default 100000)")
    p.add_argument("--supervisor", action="store_true",
                   help="also measure supervisor overhead: one coord-worker slot with a model "
                        "that exits at once, against bare sequential spawns (each round)")
    p.add_argument("--supervisor-jobs", type=int, default=None,
                   help="jobs for the supervisor measurement (default 500)")
    p.add_argument("--rev", help="benchmark coordd as committed at this git revision (e.g. "
                                 "HEAD) instead of the working tree: extracted to a temp folder")
    p.add_argument("--out", help="write all figures as JSON here")
    return p.parse_args(argv)


def _git() -> dict:
    import subprocess
    root = Path(os.environ.get("COORDD_BENCH_REPO") or Path(__file__).resolve().parent.parent)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--short", "coordd", "worker"], cwd=root,
                               capture_output=True, text=True).stdout.split("\n")
    except OSError:
        return {}
    return {"head": head, "coordd_uncommitted": [d.strip() for d in dirty if d.strip()],
            "bench_rev": os.environ.get("COORDD_BENCH_REV")}


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version, "platform": platform.platform(),
            "loadavg_start": os.getloadavg(), "git": _git()}


def one_round(i: int, workdir: Path, args: argparse.Namespace, n: int,
              clients: list[int]) -> dict:
    print(f"\n== round {i + 1}: N={n}", flush=True)
    bare = baselines.bare_sqlite(workdir, n)
    bare_lat = bare.pop("claim_lat")
    bare["claim_ms_p50"] = 1e3 * pct(bare_lat, 50)
    bare["claim_ms_p99"] = 1e3 * pct(bare_lat, 99)
    print(f"bare sqlite : drain {bare['drain_jobs_s']:8.0f} jobs/s  enqueue per-op "
          f"{bare['enqueue_per_op_jobs_s']:8.0f}/s  batch {bare['enqueue_batch_jobs_s']:8.0f}/s  "
          f"claim p50 {bare['claim_ms_p50']:.3f} ms", flush=True)
    huey = None if args.no_huey else baselines.huey_sqlite(workdir, n)
    if huey:
        print(f"huey sqlite : drain {huey['drain_jobs_s']:8.0f} jobs/s  enqueue "
              f"{huey['enqueue_jobs_s']:8.0f}/s  end-to-end {huey['end_to_end_jobs_s']:8.0f}/s",
              flush=True)
    probe = not args.plain_daemon
    enq = coordd_bench.enqueue_rates(workdir, n, args.client_procs, probe)
    rnd = {"bare": bare, "huey": huey, "enqueue": enq, "drain": {}, "ratios": {}}
    ratios = rnd["ratios"]
    ratios["enqueue_vs_bare_per_op"] = enq["jobs_s"] / bare["enqueue_per_op_jobs_s"]
    if huey:
        ratios["enqueue_vs_huey"] = enq["jobs_s"] / huey["enqueue_jobs_s"]
    print(f"coordd enqueue 1/request: {enq['jobs_s']:8.0f}/s = "
          f"{ratios['enqueue_vs_bare_per_op']:.2f}x bare per-op"
          + (f", {ratios['enqueue_vs_huey']:.2f}x huey" if huey else "")
          + f"  (req/commit {_f(enq['requests_per_commit'])})", flush=True)
    for c in clients:
        prof = None
        if args.profile and i == 0 and c == max(clients):
            prof = Path(args.profile)
            prof.mkdir(parents=True, exist_ok=True)
        d = coordd_bench.drain(workdir, n, c, args.client_procs, probe, prof)
        rnd["drain"][str(c)] = d
        ratios[f"drain{c}_vs_bare"] = d["jobs_s"] / bare["drain_jobs_s"]
        ratios[f"enqueue_batch{c}_vs_bare"] = d["enqueue_batch_jobs_s"] / bare["enqueue_batch_jobs_s"]
        if huey:  # the target is against huey's end-to-end rate; drain vs drain too
            ratios[f"drain{c}_vs_huey"] = d["jobs_s"] / huey["end_to_end_jobs_s"]
            ratios[f"drain{c}_vs_huey_drain"] = d["jobs_s"] / huey["drain_jobs_s"]
        w = d["writer"]
        print(f"coordd drain C={c:<3d}: {d['jobs_s']:8.0f} jobs/s = "
              f"{ratios[f'drain{c}_vs_bare']:.2f}x bare"
              + (f", {ratios[f'drain{c}_vs_huey']:.2f}x huey end-to-end"
                 f" ({ratios[f'drain{c}_vs_huey_drain']:.2f}x its drain)" if huey else "")
              + f" | claim p50 {d['claim_ms_p50']:.2f} p99 {d['claim_ms_p99']:.2f} ms"
              f" | calls/job {_f(d.get('rpcs_per_job'))}"
              f" | req/commit {_f(w['requests_per_commit'])} commit {_f(w['commit_ms_mean'])} ms"
              f" wait p50 {_f(w['queue_wait_ms_p50'])} p99 {_f(w['queue_wait_ms_p99'])} ms"
              f" | coordd cpu {d['coordd_cpu_s']:.1f}s ({d['coordd_cores']:.2f} cores)"
              f" client cpu {d['client_cpu_s']:.1f}s | peak rss {d['coordd_peak_rss_mb']:.0f} MB"
              f" | batch enqueue {d['enqueue_batch_jobs_s']:.0f}/s "
              f"= {ratios[f'enqueue_batch{c}_vs_bare']:.2f}x bare", flush=True)
    if args.supervisor:
        rnd["supervisor"] = supervisor.one_round(workdir, args.supervisor_jobs)
    return rnd


def _f(x: float | None, nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def medians(rounds: list[dict], clients: list[int]) -> dict:
    """Median (and min/max) of every figure over the rounds."""
    def agg(get) -> dict | None:  # type: ignore[no-untyped-def]
        vals = [v for v in (get(r) for r in rounds) if v is not None]
        if not vals:
            return None
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}

    m: dict = {"bare_drain_jobs_s": agg(lambda r: r["bare"]["drain_jobs_s"]),
               "bare_enqueue_per_op_jobs_s": agg(lambda r: r["bare"]["enqueue_per_op_jobs_s"]),
               "bare_enqueue_batch_jobs_s": agg(lambda r: r["bare"]["enqueue_batch_jobs_s"]),
               "bare_claim_ms_p50": agg(lambda r: r["bare"]["claim_ms_p50"]),
               "huey_drain_jobs_s": agg(lambda r: r["huey"] and r["huey"]["drain_jobs_s"]),
               "huey_end_to_end_jobs_s": agg(lambda r: r["huey"] and r["huey"]["end_to_end_jobs_s"]),
               "huey_enqueue_jobs_s": agg(lambda r: r["huey"] and r["huey"]["enqueue_jobs_s"]),
               "coordd_enqueue_jobs_s": agg(lambda r: r["enqueue"]["jobs_s"]),
               "coordd_enqueue_batch_jobs_s": agg(lambda r: statistics.median(
                   d["enqueue_batch_jobs_s"] for d in r["drain"].values()))}
    for c in clients:
        k = str(c)
        for f in ("jobs_s", "claim_ms_p50", "claim_ms_p99", "complete_ms_p50", "coordd_cpu_s",
                  "coordd_cores", "client_cpu_s", "coordd_peak_rss_mb", "rpcs_per_job"):
            m[f"drain{c}_{f}"] = agg(lambda r, f=f: r["drain"][k][f])
        for f in ("requests_per_commit", "commit_ms_mean", "commit_ms_p99",
                  "queue_wait_ms_p50", "queue_wait_ms_p99"):
            m[f"drain{c}_writer_{f}"] = agg(lambda r, f=f: r["drain"][k]["writer"][f])
    for key in rounds[0]["ratios"]:
        m[f"ratio_{key}"] = agg(lambda r, key=key: r["ratios"].get(key))
    if all(r.get("supervisor") for r in rounds):
        m.update(supervisor.medians([r["supervisor"] for r in rounds]))
    return m


def print_table(m: dict) -> None:
    print("\n== medians over rounds (min..max)")
    width = max(len(k) for k in m)
    for k, v in m.items():
        if v is None:
            print(f"{k:<{width}}  n/a")
        else:
            print(f"{k:<{width}}  {v['median']:>12.2f}   ({v['min']:.2f} .. {v['max']:.2f})")


def check_targets(m: dict, scale_points: list[dict]) -> dict:
    """Each target of issue 6 that this run measured: value, limit and whether it is met."""
    def med(k: str) -> float | None:
        return m[k]["median"] if m.get(k) else None
    out = {}
    for key, mkey, want_high in (
            ("drain16_vs_bare", "ratio_drain16_vs_bare", True),
            ("drain16_vs_bare_aim", "ratio_drain16_vs_bare", True),
            ("drain16_vs_huey", "ratio_drain16_vs_huey", True),
            ("claim16_p99_ms", "drain16_claim_ms_p99", False),
            ("enqueue_batch_jobs_s", "coordd_enqueue_batch_jobs_s", True)):
        v = med(mkey)
        if v is not None:
            out[key] = {"value": v, "target": TARGETS[key],
                        "met": v >= TARGETS[key] if want_high else v <= TARGETS[key]}
    pts = {p["waiting_jobs"]: p for p in scale_points}
    if 1_000 in pts and 1_000_000 in pts:
        v = pts[1_000_000]["claim_ms_p50"] / pts[1_000]["claim_ms_p50"]
        out["scale_p50_1m_vs_1k"] = {"value": v, "target": 1.2, "met": v <= 1.2}
        v = pts[1_000_000]["coordd_peak_rss_mb"]
        out["scale_rss_1m_mb"] = {"value": v, "target": 100.0, "met": v <= 100.0}
    return out


def reexec_on_rev(rev: str, argv: list[str]) -> None:
    """Extract coordd at `rev` (plus this bench/) to a temp folder and re-run from there."""
    import subprocess
    root = Path(__file__).resolve().parent.parent
    snap = Path(tempfile.mkdtemp(prefix="coordd-bench-src-"))
    trees = ["coordd"]
    if subprocess.run(["git", "cat-file", "-e", f"{rev}:worker"], cwd=root, check=False,
                      capture_output=True).returncode == 0:
        trees.append("worker")  # coord-worker at the same revision (--supervisor)
    archive = subprocess.run(["git", "archive", rev, *trees], cwd=root, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive, check=True)
    shutil.copytree(root / "bench", snap / "bench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=root, capture_output=True,
                         text=True).stdout.strip()
    env = {**os.environ, "PYTHONPATH": str(snap), "COORDD_BENCH_REV": sha,
           "COORDD_BENCH_SRC": str(snap), "COORDD_BENCH_CWD": os.getcwd(),
           "COORDD_BENCH_REPO": str(root)}
    os.chdir(snap)
    os.execve(sys.executable, [sys.executable, "-m", "bench.run", *argv], env)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.rev and not os.environ.get("COORDD_BENCH_SRC"):
        reexec_on_rev(args.rev, argv)
    cwd = Path(os.environ.get("COORDD_BENCH_CWD") or ".")
    for name in ("out", "profile"):
        if getattr(args, name):
            setattr(args, name, str(cwd / getattr(args, name)))
    global baselines, coordd_bench, scale, supervisor, pct
    from bench import baselines, coordd_bench, scale, supervisor
    from bench.daemon import pct
    import coordd
    print(f"coordd from {Path(coordd.__file__).parent}"
          + (f" (rev {os.environ['COORDD_BENCH_REV']})" if os.environ.get("COORDD_BENCH_REV")
             else " (working tree)"))
    n = args.jobs or (QUICK_N if args.quick else DEFAULT_N)
    n_rounds = args.rounds if args.rounds is not None else (1 if args.quick else DEFAULT_ROUNDS)
    if args.supervisor_jobs is None:
        args.supervisor_jobs = supervisor.DEFAULT_N
    clients = [int(c) for c in (args.clients or ("1,4,16" if args.quick else DEFAULT_CLIENTS)
                                ).split(",")]
    if not baselines.huey_available() and not args.no_huey:
        print("huey is not installed (pip install -e '.[bench]'): skipping the huey baseline")
        args.no_huey = True
    report: dict = {"args": vars(args), "n": n, "clients": clients, "machine": machine(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "rounds": []}
    print(f"machine: {report['machine']}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="coordd-bench-") as tmp:
        for i in range(n_rounds):
            rd = Path(tmp) / f"round{i}"
            rd.mkdir()
            report["rounds"].append(one_round(i, rd, args, n, clients))
            shutil.rmtree(rd, ignore_errors=True)
        if report["rounds"]:
            report["medians"] = medians(report["rounds"], clients)
            print_table(report["medians"])
        report["scale"] = []
        if args.scale:
            sizes = [s for s in (1_000, 100_000, 1_000_000) if s <= args.scale_max]
            print("\n== scale (one client, sequential claim -> complete)")
            for s in sizes:
                pt = scale.scale_point(Path(tmp), s, not args.plain_daemon)
                report["scale"].append(pt)
                print(f"waiting {s:>9,d}: claim p50 {pt['claim_ms_p50']:.3f} ms p99 "
                      f"{pt['claim_ms_p99']:.3f} ms | db {pt['db_bytes_per_job']:.0f} B/job | "
                      f"coordd rss {pt['coordd_rss_mb']:.0f} MB (peak "
                      f"{pt['coordd_peak_rss_mb']:.0f}) | preload {pt['preload_s']:.1f}s",
                      flush=True)
    report["targets"] = check_targets(report.get("medians", {}), report["scale"])
    report["elapsed_s"] = time.monotonic() - t0
    report["machine"]["loadavg_end"] = os.getloadavg()
    if report["targets"]:
        print("\n== targets (issue 6; bench/README.md, Targets: set for the default sizes, "
              "which small --jobs runs may miss)")
        for k, t in report["targets"].items():
            print(f"{k:<22} {t['value']:>10.2f}  target {t['target']:<8g} "
                  f"{'MET' if t['met'] else 'NOT MET'}")
    print(f"\nelapsed {report['elapsed_s']:.0f}s")
    if os.environ.get("COORDD_BENCH_SRC"):
        shutil.rmtree(os.environ["COORDD_BENCH_SRC"], ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
