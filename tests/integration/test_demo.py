"""The README's main job, scaled down: the demo runs every job once and leaves no process."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil


def test_demo_batch_succeeds_and_leaves_nothing_running(tmp_path):
    run = tmp_path / "run"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = subprocess.run(
        [sys.executable, "-m", "worker.demo", "--requests", "12", "--train", "1",
         "--train-steps", "30", "--run-dir", str(run), "--timeout", "120"],
        capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 13
    assert all(r["status"] == "succeeded" and r["attempts"] == 1 for r in rows)
    kw = [r for r in rows if r["kind"] == "keywords"]
    assert all(r["result"]["top"] and r["result"]["module"] for r in kw)
    train = [r for r in rows if r["kind"] == "train"]
    assert train[0]["result"]["steps"] == 30
    assert "all demo processes stopped" in out.stdout
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before
