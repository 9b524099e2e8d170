"""The worker's TOML config: defaults, rejected keys and values, argv placeholders."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from worker.__main__ import ENROLL_USAGE
from worker.config import (
    PLACEHOLDERS, WorkerConfig, WorkerConfigError, expand_argv, job_env, load, parse,
)


def test_defaults_without_a_file(monkeypatch):
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    cfg = load(None)
    assert (cfg.lease_s, cfg.heartbeat_interval_s, cfg.grace_s, cfg.stop_timeout_s) == (30, 5, 10, 30)
    assert cfg.claim_interval_s == 1 and cfg.inline_result_bytes == 65536
    assert cfg.work_dir == os.path.expanduser("~/.local/state/coordd/work")
    assert set(cfg.kinds) == {"train", "embed"}
    train = cfg.kinds["train"]
    assert train.argv[:3] == [sys.executable, "-m", "worker.models.train"]
    assert "{resume_from}" in train.argv and "{checkpoint_dir}" in train.argv
    assert (train.timeout_s, train.slots, train.max_result_bytes, train.result_json, train.env) == \
        (3600, 1, 1048576, True, {})
    assert cfg.kinds["embed"].argv[3:] == ["--payload", "{payload}", "--result", "{result}"]
    assert cfg.total_slots == 2


def test_the_default_work_dir_moves_with_xdg_state_home_as_the_database_does(tmp_path, monkeypatch):
    from coordd.paths import default_db_path
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.delenv("COORDD_DB", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert load(None).work_dir == str(tmp_path / "state" / "coordd" / "work")
    assert default_db_path().parent == tmp_path / "state" / "coordd"
    from worker import enroll
    monkeypatch.setattr(enroll.os, "geteuid", lambda: 1000)  # not root: no /etc/coordd/tls
    assert enroll.default_out() == str(tmp_path / "state" / "coordd" / "tls")


def test_file_values_and_kind_defaults(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(
        'lease_s = 12\nwork_dir = "~/jobs"\ngrace_s = 1.5\n'
        '[kinds.echo]\nargv = ["echo", "{payload}"]\nslots = 3\nenv = {A = "1"}\n'
    )
    cfg = load(path)
    assert cfg.lease_s == 12 and cfg.grace_s == 1.5 and cfg.heartbeat_interval_s == 5
    assert cfg.work_dir == os.path.expanduser("~/jobs")
    assert list(cfg.kinds) == ["echo"]
    echo = cfg.kinds["echo"]
    assert echo.slots == 3 and echo.env == {"A": "1"} and echo.timeout_s == 3600
    assert cfg.total_slots == 3


def test_file_without_kinds_gets_builtin_kinds():
    assert set(parse("lease_s = 10").kinds) == {"train", "embed"}


@pytest.mark.parametrize("text, fragment", [
    ("leese_s = 3", "leese_s"),
    ('[kinds.x]\nargv = ["a"]\nslot = 2', "slot"),
    ('lease_s = "long"', "lease_s"),
    ("lease_s = 0", "lease_s must be a finite number > 0"),
    ("grace_s = 40", "stop_timeout_s must be greater than grace_s"),
    ('[kinds.x]\nargv = []', "argv"),
    ('[kinds.x]\nargv = ["a"]\nslots = 0', "slots"),
    ('[kinds.x]\nargv = ["a"]\ntimeout_s = -1', "timeout_s"),
    ('[kinds.x]\nargv = ["a"]\nenv = {A = 1}', "env"),
    ("[kinds.x]", "argv"),
    ("lease_s = ", "not valid TOML"),
    ("kinds = {}", "at least one kind"),
])
def test_bad_config_is_a_clear_error(text, fragment):
    with pytest.raises(WorkerConfigError) as info:
        parse(text, "w.toml")
    assert fragment in str(info.value) and "w.toml" in str(info.value)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(WorkerConfigError, match="cannot read config"):
        load(tmp_path / "absent.toml")


def test_argv_placeholders_expand_once_and_leave_other_braces():
    values = {"job_id": "j1", "payload": "/w/j1/payload.json", "result": "/w/j1/{result}",
              "checkpoint_dir": "/w/j1/checkpoints", "resume_from": "",
              "usage": "/w/j1/usage.json"}
    argv = ["python", "-c", "print({'a': 1})", "--in={payload}", "{result}", "{checkpoint_dir}",
            "{resume_from}", "{job_id}-{job_id}", "{unknown}"]
    assert expand_argv(argv, values) == [
        "python", "-c", "print({'a': 1})", "--in=/w/j1/payload.json", "/w/j1/{result}",
        "/w/j1/checkpoints", "", "j1-j1", "{unknown}"]
    env = job_env(values)
    assert env == {"COORD_JOB_ID": "j1", "COORD_PAYLOAD": "/w/j1/payload.json",
                   "COORD_RESULT": "/w/j1/{result}", "COORD_CHECKPOINT_DIR": "/w/j1/checkpoints",
                   "COORD_RESUME_FROM": "", "COORD_USAGE": "/w/j1/usage.json"}
    assert len(PLACEHOLDERS) == 6


def test_struct_validates_directly():
    with pytest.raises(ValueError):
        WorkerConfig(claim_interval_s=0)


def test_coord_worker_bad_config_exits_2(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text("bogus = 1\n")
    done = subprocess.run([sys.executable, "-m", "worker", "--worker-id", "w", "--roles", "cpu",
                           "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "bogus" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_example_config_loads():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = load(os.path.join(root, "examples", "worker.toml"))
    assert set(cfg.kinds) == {"keywords", "train", "embed", "gather", "narrate", "build"}
    assert cfg.kinds["embed"].env == {"OMP_NUM_THREADS": "2"}
    assert cfg.kinds["keywords"].argv[0] == "{python}"  # the README's example job runs


def test_python_placeholder_is_the_workers_interpreter():
    assert expand_argv(["{python}", "-m", "x", "{payload}"],
                       {n: f"<{n}>" for n in PLACEHOLDERS}) == [sys.executable, "-m", "x",
                                                                "<payload>"]



def test_coord_worker_help_names_the_enroll_subcommand():
    """`coord-worker --help` (and a usage error) tell a new operator `enroll` exists."""
    out = subprocess.run([sys.executable, "-m", "worker", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "coord-worker enroll --server HOST:PORT --token TOKEN --ca-sha256 FP" in out.stdout
    assert "coord-worker enroll --help" in out.stdout
    bare = subprocess.run([sys.executable, "-m", "worker"], capture_output=True, text=True,
                          timeout=60)
    assert bare.returncode == 2 and "coord-worker enroll" in bare.stderr, bare.stderr
    enroll = subprocess.run([sys.executable, "-m", "worker", "enroll", "--help"],
                            capture_output=True, text=True, timeout=60)
    named = re.findall(r"--[a-z0-9-]+", ENROLL_USAGE)
    assert named and all(flag in enroll.stdout for flag in named), (named, enroll.stdout)
