"""coordctl as a real subprocess against a real coordd process (the `daemon` fixture):
status, list, show and the commands on a job, the reaper, workers, backup and check,
metrics, top, and how it fails (no socket, usage errors). Enqueue is
tests/integration/test_coordctl_enqueue.py; the helpers here (ctl, ok, ok_json, refused,
enqueue) serve the other coordctl tests too."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

from coordd.client import SyncClient
from tests import ctlfork

JOB_ID = re.compile(r"^[0-9a-f]{16}$")
STATUSES = ("waiting", "running", "succeeded", "failed", "cancelled", "blocked", "skipped")
COOL = {"memory_used_pct": 30.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 10_000.0}


def ctl(socket: str, *args: str, cwd: str | None = None, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m coordctl --socket SOCKET ARGS...` and capture its output (a real
    process, forked from one that imported coordctl: tests/ctlfork.py)."""
    argv = [*(["--socket", socket] if socket else []), *args]
    return ctlfork.run(argv, timeout=30, cwd=cwd, input=stdin, env={**os.environ, **(env or {})})


def ok(p: subprocess.CompletedProcess[str]) -> str:
    """Assert exit 0 and an empty stderr; return stdout."""
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert p.stderr == "", p.stderr
    return p.stdout


def ok_json(p: subprocess.CompletedProcess[str]) -> object:
    """Assert exit 0 and return the parsed JSON document on stdout."""
    return json.loads(ok(p))


def refused(p: subprocess.CompletedProcess[str], exit_code: int, code: str) -> str:
    """Assert the exit code and a single `coordctl: CODE: ...` stderr line; return it."""
    assert p.returncode == exit_code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"coordctl: {code}: "), lines[0]
    return lines[0]


def enqueue(sock: str, *extra: str, kind: str = "echo", role: str = "cpu",
            priority: int = 1, payload: str = '{"n": 1}') -> str:
    """Enqueue through coordctl; return the printed job id."""
    out = ok(ctl(sock, "enqueue", "--kind", kind, "--role", role, "--priority",
                 str(priority), "--payload", payload, *extra))
    job_id = out.strip()
    assert JOB_ID.match(job_id) and out == job_id + "\n", out
    return job_id


def test_status_json_on_empty_db_is_all_zero(daemon):
    st = ok_json(ctl(daemon.socket, "status", "--json"))
    assert st["workers"] == 0 and st["active_leases"] == 0
    assert st["jobs"] == dict.fromkeys(STATUSES, 0)
    assert st["oldest_waiting"] == [] and st["oldest_waiting_age_s"] is None
    # the global flag before the subcommand works the same way
    assert ok_json(ctl(daemon.socket, "--json", "status"))["jobs"] == st["jobs"]
    human = ok(ctl(daemon.socket, "status"))
    assert "waiting 0" in human and "cancelled 0" in human and "warnings" in human


def test_status_lists_oldest_waiting_with_reason(daemon):
    job_id = enqueue(daemon.socket, role="gpu", priority=2)
    human = ok(ctl(daemon.socket, "status"))
    assert job_id in human and "no live worker with role gpu" in human
    assert "no live worker" in human.split("warnings", 1)[1]
    st = ok_json(ctl(daemon.socket, "--json", "status"))
    assert st["jobs"]["waiting"] == 1 and st["waiting_by_priority"]["p2"] == 1
    assert st["oldest_waiting"][0]["job_id"] == job_id
    assert st["oldest_waiting"][0]["waiting_reason"] == "no live worker with role gpu"


def test_list_filters_json_and_paging(daemon):
    sock = daemon.socket
    jsonl = "".join(json.dumps({"kind": k, "required_role": r, "priority": p, "payload": {}})
                    + "\n" for k, r, p in [("alpha", "cpu", 1)] * 3 + [("beta", "gpu", 3)] * 2)
    made = ok(ctl(sock, "enqueue", "--batch", "-", stdin=jsonl)).split()  # batch from stdin
    a, b = made[:3], made[3:]
    everything = ok_json(ctl(sock, "--json", "list"))
    assert [j["job_id"] for j in everything["jobs"]] == a + b
    assert everything["next_after"] is None

    def ids(*args: str) -> list[str]:
        return [j["job_id"] for j in ok_json(ctl(sock, "--json", "list", *args))["jobs"]]

    assert ids("--kind", "alpha") == a
    assert ids("--role", "gpu") == b
    assert ids("--priority", "3") == b
    assert ids("--status", "cancelled") == []
    assert ids("--kind", "alpha", "--role", "gpu") == []
    page = ok_json(ctl(sock, "--json", "list", "--limit", "2"))
    assert [j["job_id"] for j in page["jobs"]] == a[:2] and page["next_after"] == a[1]
    assert ids("--after", a[1]) == a[2:] + b
    assert ids("--all", "--limit", "2") == a + b
    human = ok(ctl(sock, "list", "--limit", "2"))
    assert a[0] in human and b[0] not in human and f"--after {a[1]}" in human
    human = ok(ctl(sock, "list", "--role", "gpu"))
    assert all(i in human for i in b) and "no live worker with role gpu" in human
    refused(ctl(sock, "list", "--status", "bogus"), 2, "usage")


def test_show_takes_a_unique_prefix_and_names_matches_of_an_ambiguous_one(daemon):
    sock = daemon.socket
    ids = [enqueue(sock) for _ in range(3)]  # time-ordered: they share a long prefix
    for job_id in ids:  # its shortest unique prefix
        n = next(n for n in range(1, 17) if sum(i.startswith(job_id[:n]) for i in ids) == 1)
        assert ok_json(ctl(sock, "--json", "show", job_id[:n]))["job_id"] == job_id
    common = os.path.commonprefix(ids)
    line = refused(ctl(sock, "show", common), 1, "bad_request")
    assert "ambiguous" in line and all(i in line for i in ids), line
    assert "no job id starts with it" in refused(ctl(sock, "show", "fffff"), 1, "not_found")


def test_every_command_on_a_job_takes_a_unique_prefix_as_show_does(daemon):
    """`logs`, `cancel`, `retry` and `list --after` resolve a unique start of an id through
    get_job's prefix lookup and act on the whole id; an ambiguous one is refused as by `show`."""
    sock = daemon.socket
    ids = [enqueue(sock) for _ in range(3)]
    job_id = ids[0]
    n = next(n for n in range(1, 17) if sum(i.startswith(job_id[:n]) for i in ids) == 1)
    short = job_id[:n]
    got = ok_json(ctl(sock, "--json", "logs", short))
    assert got["job_id"] == job_id and got["status"] == "waiting", got
    assert ok(ctl(sock, "cancel", short)) == f"{job_id}: cancelled\n"
    assert ok(ctl(sock, "retry", short)) == f"{job_id}: waiting\n"
    after = [j["job_id"] for j in ok_json(ctl(sock, "--json", "list", "--after", short))["jobs"]]
    assert after == ids[1:]
    common = os.path.commonprefix(ids)
    for args in (("logs", common), ("cancel", common), ("retry", common),
                 ("list", "--after", common)):
        line = refused(ctl(sock, *args), 1, "bad_request")
        assert "ambiguous" in line and all(i in line for i in ids), (args, line)
    for args in (("logs", "fffff"), ("cancel", "fffff"), ("retry", "fffff")):
        assert "no job id starts with it" in refused(ctl(sock, *args), 1, "not_found")
    assert ok_json(ctl(sock, "--json", "show", job_id))["status"] == "waiting"


def test_cancel_then_retry(daemon):
    job_id = enqueue(daemon.socket)
    assert ok(ctl(daemon.socket, "cancel", job_id)) == f"{job_id}: cancelled\n"
    assert ok_json(ctl(daemon.socket, "--json", "show", job_id))["status"] == "cancelled"
    assert ok(ctl(daemon.socket, "retry", job_id)) == f"{job_id}: waiting\n"
    job = ok_json(ctl(daemon.socket, "--json", "show", job_id))
    assert job["status"] == "waiting"
    assert [e["to_status"] for e in job["events"]] == ["waiting", "cancelled", "waiting"]
    refused(ctl(daemon.socket, "retry", job_id), 1, "invalid_state")
    refused(ctl(daemon.socket, "cancel", "ffffffffffffffff"), 1, "not_found")


def test_cancel_of_a_running_job_says_cancel_requested_and_list_shows_its_lease(daemon):
    sock = daemon.socket
    job_id = enqueue(sock)
    with SyncClient(sock) as c:
        c.heartbeat("w-list", ["cpu"], COOL)
        lease = c.claim("w-list", lease_s=300.0).lease
    assert lease is not None
    table = ok(ctl(sock, "list"))
    header, row = table.splitlines()[0], next(r for r in table.splitlines() if job_id in r)
    assert "worker" in header and "lease left" in header
    assert "w-list" in row and re.search(r"\b4m[0-9]{2}s\b", row), row
    out = ok(ctl(sock, "cancel", job_id))
    assert out.startswith(f"{job_id}: cancel requested"), out
    assert ok_json(ctl(sock, "--json", "cancel", job_id))["status"] == "running"


def test_reap_requeues_expired_lease(daemon_factory):
    d = daemon_factory("lease_min_s = 0.1\nreaper_interval_s = 3600.0\n")
    d.start()
    job_id = enqueue(d.socket)
    assert ok_json(ctl(d.socket, "--json", "reap")) == {"reaped": 0}
    with SyncClient(d.socket, timeout=10) as c:
        c.heartbeat("w1", ["cpu"], COOL)
        got = c.claim("w1", lease_s=0.1)
        assert got.job.job_id == job_id
        assert ok_json(ctl(d.socket, "--json", "status"))["active_leases"] == 1
        time.sleep(0.3)  # a real process on the real clock: let the 0.1 s lease run out
    show = ok(ctl(d.socket, "show", job_id))
    assert "EXPIRED" in show and "worker w1" in show
    assert ok(ctl(d.socket, "reap")) == "reaped 1 expired lease(s)\n"
    job = ok_json(ctl(d.socket, "--json", "show", job_id))
    assert job["status"] == "waiting" and job["lease"] is None and job["attempts"] == 1
    assert ok(ctl(d.socket, "reap")) == "reaped 0 expired lease(s)\n"


def test_workers_show_gate_verdicts(daemon):
    with SyncClient(daemon.socket, timeout=10) as c:
        c.heartbeat("w-hot", ["cpu", "gpu"],
                    {"memory_used_pct": 90.0, "temperature_c": None, "on_battery": False,
                     "user_idle_s": 5.0, "temperature_reason": "no thermal sensors"})
        c.heartbeat("w-cool", ["cpu"], COOL)
    res = ok_json(ctl(daemon.socket, "--json", "workers"))
    by_id = {w["worker_id"]: w for w in res["workers"]}
    hot, cool = by_id["w-hot"], by_id["w-cool"]
    assert hot["verdicts"]["p0"] == ["memory_high"] and hot["live"] is True
    assert "user_active" in hot["verdicts"]["p3"]
    assert all(v == [] for v in cool["verdicts"].values())
    human = ok(ctl(daemon.socket, "workers"))
    hot_row = next(line for line in human.splitlines() if line.strip().startswith("w-hot"))
    cool_row = next(line for line in human.splitlines() if line.strip().startswith("w-cool"))
    assert "memory_high" in hot_row and "unavailable (no thermal sensors)" in hot_row
    assert "cpu,gpu" in hot_row and "90" in hot_row and "mains" in hot_row
    assert "memory_high" not in cool_row and cool_row.split()[-4:] == ["ok"] * 4


def test_backup_then_check_the_copy(daemon, tmp_path):
    ids = sorted(enqueue(daemon.socket, payload=f'{{"i": {i}}}') for i in range(3))
    out = ok(ctl(daemon.socket, "backup", "copy.db", cwd=str(tmp_path)))  # relative DEST
    dest = tmp_path / "copy.db"
    assert out == f"backup written to {dest} ({dest.stat().st_size} bytes, 3 jobs); " \
                  "quick_check: ok\n"
    checked = ok(ctl(daemon.socket, "check", str(dest)))
    assert "quick_check: ok" in checked and "foreign key violations: 0" in checked
    assert ok_json(ctl("", "--json", "check", str(dest)))["jobs"] == 3  # no coordd needed
    with closing(sqlite3.connect(f"file:{dest}?mode=ro", uri=True)) as conn:
        assert sorted(r[0] for r in conn.execute("SELECT job_id FROM jobs")) == ids
    assert ok_json(ctl(daemon.socket, "--json", "check")) == {
        "quick_check": "ok", "foreign_key_violations": 0,
        "invariants": []}
    assert "exists" in refused(ctl(daemon.socket, "backup", str(dest)), 1, "bad_request")


def test_check_refuses_non_sqlite_and_missing_files(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_text("this is not a database\n" * 100)
    p = ctl("", "check", str(junk))
    assert "junk.db" in refused(p, 1, "check_failed") and p.stdout == ""
    refused(ctl("", "check", str(tmp_path / "absent.db")), 1, "not_found")
    assert not (tmp_path / "absent.db").exists()  # read-only: nothing created
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()  # a valid but empty SQLite file is not a coordd DB
    assert "no jobs table" in refused(ctl("", "check", str(empty)), 1, "check_failed")


def test_missing_socket_is_one_line_exit_1(tmp_path):
    sock = str(tmp_path / "nobody-home.sock")
    p = ctl(sock, "status")
    line = refused(p, 1, "disconnected")
    assert line.startswith(f"coordctl: disconnected: coordd is not running at {sock}")
    assert p.stdout == ""
    # $COORDD_SOCKET is the default when --socket is not given
    p = ctl("", "list", env={"COORDD_SOCKET": sock})
    assert sock in refused(p, 1, "disconnected")


def test_usage_errors_exit_2(tmp_path):
    refused(ctl("", env={"COORDD_SOCKET": str(tmp_path / "s")}), 2, "usage")
    refused(ctl(str(tmp_path / "s"), "frobnicate"), 2, "usage")
    refused(ctl(str(tmp_path / "s"), "show"), 2, "usage")
    refused(ctl(str(tmp_path / "s"), "--timeout", "-1", "status"), 2, "usage")
    helped = ctl("", "--help")
    assert helped.returncode == 0 and "backup" in helped.stdout and "enqueue" in helped.stdout


def test_metrics_parse_with_prometheus_parser_and_hold_the_series(daemon):
    """`coordctl metrics` parses with prometheus-client's own parser and has every series."""
    from prometheus_client.parser import text_string_to_metric_families

    with SyncClient(daemon.socket, timeout=10) as c:
        c.heartbeat("w1", ["cpu"], {"memory_used_pct": 95.0})  # over the gate: a refusal
        job = c.enqueue(kind="k", required_role="cpu", priority=1)
        assert c.claim("w1").reasons == ["memory_high"]
        c.heartbeat("w1", ["cpu"], {"memory_used_pct": 10.0})
        assert c.claim("w1").job.job_id == job.job_id
    out = ctl(daemon.socket, "metrics")
    assert out.returncode == 0, out.stderr
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(out.stdout) for s in fam.samples}
    assert samples[("coordd_claims_total", ())] == 1
    assert samples[("coordd_claim_refusals_total", (("reason", "memory_high"),))] == 1
    assert samples[("coordd_jobs", (("status", "running"),))] == 1
    assert samples[("coordd_waiting_jobs", (("priority", "1"),))] == 0
    assert samples[("coordd_active_leases", ())] == 1
    assert samples[("coordd_workers", (("state", "live"),))] == 1
    assert samples[("coordd_writer_batch_size_count", ())] >= 5
    assert ("coordd_writer_commit_seconds_bucket", (("le", "0.001"),)) in samples
    assert samples[("coordd_writer_queue_wait_seconds_count", ())] >= 5
    assert ("coordd_writer_queue_depth", ()) in samples
    assert ("coordd_lease_expiries_total", ()) in samples
    assert samples[("coordd_storage_bytes", (("file", "db"),))] > 0
    assert ("coordd_storage_bytes", (("file", "artifacts"),)) in samples


def test_top_once_and_q_quits_the_live_view(daemon):
    """`top --once` prints one frame; on a terminal, `q` ends the live view with exit 0."""
    import pty
    import select
    with SyncClient(daemon.socket, timeout=10) as c:
        c.heartbeat("w1", ["cpu"], {"memory_used_pct": 90.0})
        c.enqueue(kind="k", required_role="cpu", priority=1)
    out = ok(ctl(daemon.socket, "top", "--once"))
    assert "coordd status" in out and "memory_high" in out and "recent failures" in out
    small = ok(ctl(daemon.socket, "top", "--once", env={"COLUMNS": "80", "LINES": "24"}))
    assert "memory_high" in small and len(small.splitlines()) <= 24, small
    assert max(len(line) for line in small.splitlines()) <= 80, small
    assert "quits" not in out and "refresh every" not in small  # a one-shot: no footer
    doc = ok_json(ctl(daemon.socket, "top", "--json"))
    assert doc["status"]["jobs"]["waiting"] == 1 and doc["workers"][0]["worker_id"] == "w1"

    # into a pipe: a whole frame per interval as it comes (rich's Live showed a pipe
    # nothing until it stopped, and nothing at all when killed)
    proc = subprocess.Popen([sys.executable, "-m", "coordctl", "--socket", daemon.socket, "top",
                             "--interval", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    piped = b""
    try:
        deadline = time.monotonic() + 15
        while piped.count(b"coordd status") < 2 and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.2)[0]:
                piped += os.read(proc.stdout.fileno(), 65536)
        assert piped.count(b"coordd status") >= 2 and b"memory_high" in piped, piped
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "coordctl", "--socket", daemon.socket, "top",
                             "--interval", "0.2"], stdin=slave, stdout=slave, stderr=slave,
                            close_fds=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 15
        while b"coordd status" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                seen += os.read(master, 65536)
        assert b"coordd status" in seen
        os.write(master, b"q")
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
