"""`coordctl logs` through a real coordd and coord-worker: a model's stdout and stderr are
shipped while it runs and at its end, per attempt, and read back after the job folder is
gone; `--follow` ends when the job does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.integration.test_coordctl import ctl
from tests.integration.workerbench import bench  # noqa: F401  (the fixture)

MODEL = textwrap.dedent("""
    import json, os, sys, time
    p = json.load(open(os.environ["COORD_PAYLOAD"]))
    n = int(open(p["counter"]).read()) + 1 if os.path.exists(p["counter"]) else 1
    open(p["counter"], "w").write(str(n))
    print(f"attempt {n} starting", flush=True)
    sys.stderr.write("warn: \\x1b[31mred\\x1b[0m caf\\u00e9\\n")
    sys.stderr.flush()
    time.sleep(p["sleep"] if n == 1 else 0)
    print("done", flush=True)
    if n == 1:
        sys.exit(75)
    with open(os.environ["COORD_RESULT"], "w") as fh:
        json.dump({"attempt": n}, fh)
""")


async def test_logs_follow_prints_every_attempts_output_after_the_folder_is_gone(bench):  # noqa: F811
    model = bench.tmp / "chatty.py"
    model.write_text(MODEL)
    job = await bench.enqueue({"sleep": 3.0, "counter": str(bench.tmp / "n")}, kind="chatty")
    follow = subprocess.Popen(
        [sys.executable, "-m", "coordctl", "--socket", bench.daemon.socket, "logs", job,
         "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        w = bench.start_worker(extra_kinds={"chatty": {"argv": [sys.executable, str(model)]}})
        out, err = follow.communicate(timeout=40)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    final = await bench.client.get_job(job)
    assert final.status == "succeeded" and final.attempts == 2, (final.last_error, w.log())
    assert out == "attempt 1 starting\ndone\nattempt 2 starting\ndone\n", (out, err)
    assert err.count("warn: \\x1b[31mred\\x1b[0m café\n") == 2, err  # escaped, whole
    assert "--- attempt 1 (worker w1, lease token " in err and "--- attempt 2 (" in err
    assert err.index("--- attempt 1") < err.index("warn") < err.index("--- attempt 2")

    logs = await bench.client.job_logs(job)
    first = [(c.pos, c.data) for c in logs.chunks if c.attempt == 1 and c.stream == "stdout"]
    assert first == [(0, b"attempt 1 starting\n"), (19, b"done\n")]  # shipped while it ran
    assert not any(p.name == job for p in w.work_dir.iterdir())  # the folder is gone

    raw = ctl(bench.daemon.socket, "logs", job, "--raw", "--stream", "stderr", "--attempt", "2")
    assert raw.returncode == 0 and raw.stdout == ""
    assert raw.stderr.endswith("warn: \x1b[31mred\x1b[0m café\n"), raw.stderr
    both = ctl(bench.daemon.socket, "logs", job, "--stream", "stdout")
    assert both.returncode == 0 and both.stdout.count("done") == 2 and "warn" not in both.stderr
    missing = ctl(bench.daemon.socket, "logs", "nosuchjob")
    assert missing.returncode == 1 and missing.stderr.startswith("coordctl: not_found:")
