"""The worker's own checks (issue 14): kinds whose command cannot run, the readings
override's unknown keys, and one log line per coordd outage with backoff."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from worker import kinds as kinds_mod
from worker.__main__ import parse_args
from worker.config import KindConfig
from worker.kinds import KindHealth, check
from worker.link import Link
from worker.override import ReadingsOverride
from worker.probes import READING_KEYS


def test_check_finds_missing_unexecutable_and_directory_programs(tmp_path: Path) -> None:
    script = tmp_path / "model"
    script.write_text("#!/bin/sh\nexit 0\n")
    assert "no such file" in check(KindConfig(argv=["/nonexistent/model"]))
    assert "permission denied" in check(KindConfig(argv=[str(script)]))
    assert "is a directory" in check(KindConfig(argv=[str(tmp_path)]))
    assert "not found on PATH" in check(KindConfig(argv=["no-such-program-xyz"]))
    script.chmod(0o755)
    assert check(KindConfig(argv=[str(script)])) is None
    assert check(KindConfig(argv=["model"], env={"PATH": str(tmp_path)})) is None  # kind's PATH
    assert check(KindConfig(argv=["{python}", "-m", "x"])) is None
    assert check(KindConfig(argv=["{payload}"])) is None  # known per job only: spawn decides


def test_broken_kind_is_not_advertised_until_a_recheck_passes(tmp_path: Path, caplog) -> None:
    script = tmp_path / "model"
    kinds = {"ok": KindConfig(argv=[sys.executable]), "bad": KindConfig(argv=[str(script)])}
    with caplog.at_level(logging.ERROR, logger="worker.kinds"):
        health = KindHealth(kinds, now=0.0)
    assert health.usable() == ["ok"] and "no such file" in health.broken()["bad"]
    assert any("kind bad is not usable" in r.getMessage() for r in caplog.records)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    health.recheck(kinds_mod.RECHECK_S - 1)
    assert health.usable() == ["ok"]  # not yet: one check per RECHECK_S
    health.recheck(kinds_mod.RECHECK_S)
    assert health.usable() == ["bad", "ok"] and health.broken() == {}
    health.set_broken("ok", "cannot start: exec format error")  # a failed spawn
    assert health.usable() == ["bad"] and health.is_broken("ok")


def test_a_program_that_cannot_be_executed_stays_broken_until_its_file_changes(
        tmp_path: Path) -> None:
    """Issue 31 item 6: the start check passes an executable file that exec refuses
    (Exec format error); after its spawn failed, every recheck advertised it again, and
    the job was claimed and handed back once a minute forever."""
    garbage = tmp_path / "not-a-program"
    garbage.write_bytes(b"\x7fELF garbage")
    garbage.chmod(0o755)
    health = KindHealth({"garbled": KindConfig(argv=[str(garbage)]),
                         "ok": KindConfig(argv=[sys.executable])}, now=0.0)
    assert health.usable() == ["garbled", "ok"]  # the check cannot tell
    health.cannot_exec("garbled", f"cannot start {garbage}: [Errno 8] Exec format error")
    for n in range(1, 4):
        health.recheck(n * kinds_mod.RECHECK_S)
        assert health.usable() == ["ok"]
        assert "Exec format error" in health.broken()["garbled"]
    garbage.write_text("#!/bin/sh\nexit 0\n")  # fixed: a new file
    health.recheck(4 * kinds_mod.RECHECK_S)
    assert health.usable() == ["garbled", "ok"] and health.broken() == {}
    # a program only the spawn can judge (a placeholder) is rechecked as before
    per_job = KindHealth({"p": KindConfig(argv=["{payload}"])}, now=0.0)
    per_job.cannot_exec("p", "cannot start x: [Errno 13] Permission denied")
    per_job.recheck(kinds_mod.RECHECK_S)
    assert per_job.usable() == ["p"]


def test_worker_refuses_to_start_when_no_kind_can_run(tmp_path: Path) -> None:
    cfg = tmp_path / "w.toml"
    cfg.write_text(f'work_dir = {json.dumps(str(tmp_path / "work"))}\n'
                   '[kinds.m]\nargv = ["/nonexistent/model"]\n')
    done = subprocess.run([sys.executable, "-m", "worker", "--worker-id", "w1", "--roles", "cpu",
                           "--config", str(cfg), "--socket", str(tmp_path / "none.sock")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "no configured kind can run here" in done.stderr
    assert "kind m is not usable" in done.stderr and "/nonexistent/model" in done.stderr


def test_readings_override_help_says_file_and_unknown_keys_warn(tmp_path: Path, caplog,
                                                                 capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "JSON file" in " ".join(capsys.readouterr().out.split())
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"memory_pct": 99, "temperature_c": 50}))
    override = ReadingsOverride(str(path), READING_KEYS)
    with caplog.at_level(logging.WARNING, logger="worker.override"):
        got = override.apply({"memory_used_pct": 10.0})
        override.apply({"memory_used_pct": 10.0})  # same keys: no second line
    assert got["memory_used_pct"] == 10.0 and got["temperature_c"] == 50
    lines = [r.getMessage() for r in caplog.records if "unknown key" in r.getMessage()]
    assert len(lines) == 1 and "'memory_pct'" in lines[0] and "memory_used_pct" in lines[0]


def test_link_logs_each_change_once_and_backs_off(caplog) -> None:
    link = Link(base_s=0.5, cap_s=4.0)
    assert link.delay(1.0) == 1.0
    with caplog.at_level(logging.INFO, logger="worker.link"):
        delays = []
        for _ in range(6):
            link.failed(ConnectionError("refused"))
            delays.append(link.delay(0.1))
        link.answered()
        link.answered()
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "coordd unreachable", "coordd reachable again"]
    assert link.delay(0.1) == 0.1
