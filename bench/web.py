"""Benchmark: the web view's pages with a million jobs stored (issue 19).

    python -m bench.web [--jobs 1000000] [--repeat 30] [--keep DIR]

Builds the database with direct SQL (bench.pressure.preload: the counters' triggers run
as for any insert), starts coordd on it and coordd-web beside it, then times each page
over one keep-alive HTTP connection: median, p95 and max in ms, and whether the median
is under the 200 ms goal. The rare kind is the oldest group, so its filter finds nothing
in the newest window: the cost of a page with no match at all.
"""

from __future__ import annotations

import argparse
import http.client
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.daemon import Daemon, pct
from bench.pressure import fresh_daemon, preload

GOAL_MS = 200.0


def groups(n: int) -> list[tuple[int, str, str, int, str]]:
    """(n, kind, role, priority, status), oldest first: 10 rare, then the rest."""
    rest = n - 10
    return [(10, "rare", "cpu", 2, "failed"),
            (int(rest * 0.10), "beta", "cpu", 1, "failed"),
            (int(rest * 0.05), "gamma", "gpu", 0, "cancelled"),
            (int(rest * 0.70), "alpha", "cpu", 2, "succeeded"),
            (rest - int(rest * 0.10) - int(rest * 0.05) - int(rest * 0.70),
             "alpha", "cpu", 3, "waiting")]


def start_web(socket: str) -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen([sys.executable, "-m", "coordd_web", "--socket", socket,
                             "--port", "0", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = proc.stdout.readline().decode()
    m = re.search(r"http://([\d.]+):(\d+)/", line)
    if not m:
        raise RuntimeError(f"coordd-web said {line!r}")
    return proc, m.group(1), int(m.group(2))


def timed(conn: http.client.HTTPConnection, path: str, repeat: int) -> list[float]:
    out = []
    for i in range(repeat + 3):  # 3 warm-ups
        t = time.perf_counter()
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        ms = (time.perf_counter() - t) * 1000
        if resp.status != 200:
            raise RuntimeError(f"{path}: {resp.status} {body[:200]!r}")
        if i >= 3:
            out.append(ms)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.web")
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--keep", help="work in this folder (kept; a database built there by "
                    "an earlier run is used again) instead of a temp one")
    args = ap.parse_args(argv)
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="bench-web-")
    workdir = Path(args.keep or tmp.name)
    if args.keep and (workdir / "web" / "coordd.db").exists():  # built by an earlier run
        d = Daemon(workdir / "web", probe=False)
        print(f"reusing {d.db}")
    else:
        d = fresh_daemon(workdir, "web")
        t0 = time.time() - args.jobs * 1e-3
        took = preload(d.db, groups(args.jobs), t0)
        print(f"preloaded {args.jobs:,} jobs in {took:.1f}s "
              f"({Path(d.db).stat().st_size >> 20} MiB)")
    d.start()
    web, host, port = start_web(d.socket)
    try:
        newest, mid, oldest = (f"p{j:09x}" for j in (args.jobs - 1, args.jobs // 2, 0))
        pages = [
            ("jobs page", "/jobs"),
            ("jobs, status=failed", "/jobs?status=failed"),
            ("jobs, status=waiting P3", "/jobs?status=waiting&priority=3"),
            ("jobs, status=failed kind=rare", "/jobs?status=failed&kind=rare"),
            ("jobs, kind=rare (no match in the window)", "/jobs?kind=rare"),
            ("jobs, text search", "/jobs?q=%22i%22%3A+999"),
            ("jobs, worker=w9 (event log)", "/jobs?worker=w9"),
            ("jobs, a page in the middle", f"/jobs?before={mid}"),
            ("jobs, the last page", f"/jobs?before=p{60:09x}"),
            ("job page (newest)", f"/jobs/{newest}"),
            ("job page (middle)", f"/jobs/{mid}"),
            ("job page (oldest)", f"/jobs/{oldest}"),
            ("overview", "/"),
            ("workers", "/workers"),
        ]
        conn = http.client.HTTPConnection(host, port, timeout=30)
        print(f"{'page':44} {'median':>8} {'p95':>8} {'max':>8}  goal")
        worst = 0.0
        for name, path in pages:
            ms = timed(conn, path, args.repeat)
            med = pct(ms, 50)
            goal = name.startswith(("jobs", "job page"))
            if goal:
                worst = max(worst, med)
            print(f"{name:44} {med:8.1f} {pct(ms, 95):8.1f} {max(ms):8.1f}  "
                  f"{('ok' if med < GOAL_MS else 'OVER') if goal else '-'}")
        conn.close()
    finally:
        web.send_signal(signal.SIGTERM)
        web.wait(10)
        d.stop()
        if tmp is not None:
            tmp.cleanup()
    print(f"worst median of the jobs and job pages: {worst:.1f} ms (goal < {GOAL_MS:.0f} ms)")
    return 0 if worst < GOAL_MS else 1


if __name__ == "__main__":
    sys.exit(main())
