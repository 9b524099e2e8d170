"""What a new operator reads when something is wrong (issue 31 item 11): each message
names the table, the node, the field, the path, the user or the way out."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from coordctl import __main__ as coordctl_main
from coordctl.commands import UsageError
from coordctl.workflow import read_graph
from coordd import config, errors, store
from coordd.store.sqlite import backup
from coordd.service import workflows
from coordd.errors import ConfigError
from coordd.rules.transitions import RETRIED
from worker import config as wconfig

pytestmark = pytest.mark.timeout(30)
EXAMPLE_WORKFLOW = Path(__file__).resolve().parents[2] / "examples" / "workflow.toml"


def run_coordctl(*argv: str) -> int:
    """coordctl in this process: its exit code."""
    try:
        return coordctl_main.main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("text,said", [
    ('[kinds.embed]\nargv = ["x"]\nslot = 2\n', "unknown field `slot` - in [kinds.embed]"),
    ('[kinds.a]\nargv = ["x"]\n[kinds.b]\nargv = ["y"]\nslots = "2"\n',
     "Expected `int`, got `str` - at `kinds.b.slots`"),
    ('[kinds."my kind"]\nargv = ["x"]\nslot = 1\n', 'in [kinds."my kind"]'),
    ('[resources]\nvram = 3\n', "unknown field `vram` - in [resources]"),
    ("leases = 3\n", "unknown field `leases` - at the top level (before any [table])"),
])
def test_a_worker_config_error_names_the_table(text, said):
    with pytest.raises(wconfig.WorkerConfigError) as got:
        wconfig.parse(text, "w.toml")
    assert said in str(got.value) and "[...]" not in str(got.value)


def test_a_coordd_config_error_names_the_table(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[limits.gpu]\nslot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown field `slot` - in \[limits.gpu\]"):
        config.load(cfg)
    cfg.write_text('tls_deny_workers = ["wa", 3]\n')  # a plain path stays as msgspec says it
    with pytest.raises(ConfigError, match=r"at `\$.tls_deny_workers\[1\]`"):
        config.load(cfg)


@pytest.mark.parametrize("change,said", [
    (("max_attempts = 3", "max_attempt = 3"),
     'unknown field `max_attempt` - in `nodes[1]` (the [[nodes]] table named "narrate")'),
    (("priority = 2", 'priority = "high"'),
     'Expected `int`, got `str` - at `nodes[0].priority` (the [[nodes]] table named "gather")'),
])
def test_a_workflow_error_names_the_node(tmp_path, change, said):
    src = EXAMPLE_WORKFLOW.read_text()
    (tmp_path / "wf.toml").write_text(src.replace(*change, 1))
    with pytest.raises(UsageError) as got:
        read_graph(str(tmp_path / "wf.toml"))
    assert said in str(got.value), got.value


@pytest.mark.parametrize("cron,said", [
    ("61 * * * *", "the minute field (1st) is '61'; it takes 0-59"),
    ("0 25 * * *", "the hour field (2nd) is '25'; it takes 0-23"),
    ("0 0 32 * *", "the day of the month field (3rd) is '32'; it takes 1-31"),
    ("0 0 * 13 *", "the month field (4th) is '13'; it takes 1-12 or jan-dec"),
    ("0 0 * * 8", "the day of the week field (5th) is '8'; it takes 0-7"),
    ("*/0 * * * *", "the minute field (1st) is '*/0'"),
    ("0 0 30 2 *", "is '30', a day no month given in the 4th field ('2') has"),
])
def test_a_bad_cron_field_says_which_value_and_range(cron, said):
    with pytest.raises(errors.BadRequest) as got:
        workflows.check_cron(cron)
    assert said in got.value.message and "Bad " not in got.value.message


def _db(path) -> str:
    """An empty coordd database (its schema) at `path`."""
    conn = sqlite3.connect(path)
    store.migrate(conn)
    conn.commit()
    conn.close()
    return str(path)


def test_a_backup_the_user_may_not_write_names_the_path_and_user(tmp_path):
    dest = "/sys/coordd-backup.db"  # refused to every user, root too (EACCES)
    with pytest.raises(errors.BadRequest) as got:
        backup.backup(_db(tmp_path / "c.db"), str(tmp_path / "artifacts"), dest)
    msg = got.value.message
    assert dest in msg and f"uid {os.geteuid()}" in msg and "Permission denied" in msg, msg


def test_restore_into_a_missing_folder_says_it_is_the_folder(tmp_path, capsys):
    code = run_coordctl(*["restore", str(tmp_path / "b.db"), "--db",
                               str(tmp_path / "nodir" / "coordd.db")])
    err = capsys.readouterr().err
    assert code == 1 and "restore_refused" in err and str(tmp_path / "nodir") in err, err
    assert "does not exist" in err and "cannot connect" not in err


@pytest.mark.skipif(os.geteuid() != 0, reason="restoring as root")
def test_restore_as_root_into_a_service_folder_says_what_to_chown(tmp_path, capsys):
    src = _db(tmp_path / "src.db")
    d = tmp_path / "svc"
    d.mkdir()
    taken = tmp_path / "b.db"
    backup.backup(src, str(tmp_path / "artifacts"), str(taken))
    os.chown(d, 65534, 65534)  # coordd's own folder, as systemd's StateDirectory makes it
    capsys.readouterr()
    assert run_coordctl(*["restore", str(taken), "--db", str(d / "coordd.db")]) == 0
    err = capsys.readouterr().err
    assert "warning: restored as root" in err and f"{d / 'coordd.db'}" in err, err
    assert "chown -R " in err and f"{d / 'coordd.db.lock'}" in err, err
    shutil.rmtree(d)


def test_restore_into_a_folder_of_its_own_user_says_nothing(tmp_path):
    db = _db(tmp_path / "x.db")  # tmp_path is this user's (root's, when root)
    assert backup.ownership_problem(db, str(tmp_path / "artifacts")) is None


def test_coordctl_points_at_the_system_socket_when_the_per_user_one_is_absent(
        tmp_path, monkeypatch, capsys):
    system = tmp_path / "run-coordd" / "coordd.sock"
    system.parent.mkdir()
    monkeypatch.setattr(coordctl_main, "SYSTEM_SOCKET", str(system))
    monkeypatch.delenv("COORDD_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "user-run"))
    assert run_coordctl(*["status"]) == 1
    err = capsys.readouterr().err
    assert f"use --socket {system}" in err and "coordd group" in err, err
    assert run_coordctl(*["--socket", str(tmp_path / "x.sock"), "status"]) == 1
    assert "system service" not in capsys.readouterr().err  # a path was given
    shutil.rmtree(system.parent)
    assert run_coordctl(*["status"]) == 1
    assert "system service" not in capsys.readouterr().err  # no system install here


def test_retry_help_names_every_status_retry_takes(capsys):
    """`coordctl retry --help` said "a failed or cancelled job"; coordd also retries a
    skipped workflow node (coordd.rules.transitions.RETRIED)."""
    with pytest.raises(SystemExit):
        coordctl_main.build_parser().parse_args(["retry", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert set(RETRIED) == {"failed", "cancelled", "skipped"}
    assert "put a failed, cancelled or skipped job back to waiting" in text, text
