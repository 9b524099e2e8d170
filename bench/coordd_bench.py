"""The coordd side of a round: enqueue rates, then a drain per client count on a fresh daemon."""

from __future__ import annotations

from pathlib import Path

from bench.daemon import Daemon, pct, writer_delta
from bench.load import run_phase
from bench.profile import Profiler, print_summary, summarize

ENQUEUE_CONNS = 4
ENQUEUE_BATCH = 500
ENQUEUE_BATCH_CONNS = 2


def client_procs(conns: int, max_procs: int) -> int:
    """Load processes for `conns` connections: 1 for a single connection, else `max_procs`."""
    return 1 if conns <= 1 else max_procs


def enqueue_rates(workdir: Path, n: int, max_procs: int, probe: bool) -> dict:
    """One request per job over ENQUEUE_CONNS connections, on its own daemon."""
    d = Daemon(workdir / "enqueue", probe=probe)
    d.workdir.mkdir(parents=True)
    d.start()
    try:
        before: dict = {}
        r = run_phase("enqueue", d.socket, ENQUEUE_CONNS, client_procs(ENQUEUE_CONNS, max_procs),
                      n_jobs=n, on_go=lambda: before.update(s=d.writer_stats()))
        w = writer_delta(before.get("s"), d.writer_stats())
        cpu = d.cpu_since_mark()
    finally:
        d.stop()
    if r.done != n:
        raise RuntimeError(f"enqueue: {r.done} of {n} acknowledged")
    return {"jobs_s": r.rate, "wall_s": r.wall_s, "coordd_cpu_s": cpu,
            "client_cpu_s": r.client_cpu_s, "requests_per_commit": w["requests_per_commit"]}


def drain(workdir: Path, n: int, conns: int, max_procs: int, probe: bool,
          profile: Path | None) -> dict:
    """Fresh daemon: batch-enqueue N jobs (measured), then drain them with `conns` clients.

    With `profile` (a folder), py-spy samples coordd during the drain; the raw stacks go
    there and a summary goes into the result.
    """
    d = Daemon(workdir / f"drain{conns}", probe=probe)
    d.workdir.mkdir(parents=True)
    d.start()
    try:
        eb = run_phase("enqueue_batch", d.socket, ENQUEUE_BATCH_CONNS, 1, n_jobs=n,
                       batch=ENQUEUE_BATCH)
        if eb.done != n:
            raise RuntimeError(f"enqueue_batch: {eb.done} of {n} acknowledged")
        before: dict = {}

        def on_go() -> None:
            before["s"] = d.writer_stats()
            d.mark_cpu()

        prof_path = (profile or d.workdir) / f"pyspy_drain{conns}.txt"
        with (Profiler(d.proc.pid, prof_path) if profile else _Null()):
            r = run_phase("drain", d.socket, conns, client_procs(conns, max_procs),
                          tag=f"c{conns}", on_go=on_go)
        cpu = d.cpu_since_mark()
        w = writer_delta(before.get("s"), d.writer_stats())
        rss, peak = d.rss_mb()
    finally:
        d.stop()
    if r.done != n:
        raise RuntimeError(f"drain at {conns} clients: {r.done} of {n} claimed+completed")
    out = {
        "clients": conns, "client_procs": client_procs(conns, max_procs),
        "enqueue_batch_jobs_s": eb.rate,
        "jobs_s": r.rate, "wall_s": r.wall_s,
        "rpcs_per_job": r.rpcs / r.done if r.done else None,  # eager dispatch: ~1 + 1/n
        "claim_ms_p50": 1e3 * pct(list(r.claim_lat), 50),
        "claim_ms_p99": 1e3 * pct(list(r.claim_lat), 99),
        "complete_ms_p50": 1e3 * pct(list(r.complete_lat), 50),
        "complete_ms_p99": 1e3 * pct(list(r.complete_lat), 99),
        "coordd_cpu_s": cpu, "coordd_cores": cpu / r.wall_s if r.wall_s else None,
        "client_cpu_s": r.client_cpu_s,
        "coordd_rss_mb": rss, "coordd_peak_rss_mb": peak,
        "writer": w,
    }
    if profile and prof_path.exists():
        out["profile"] = summarize(prof_path)
        out["profile_file"] = str(prof_path)
        print(f"  py-spy profile of coordd during the {conns}-client drain ({prof_path}):")
        print_summary(out["profile"])
    return out


class _Null:
    def __enter__(self) -> "_Null":
        return self

    def __exit__(self, *exc: object) -> None:
        return None
