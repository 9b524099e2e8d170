"""What coordctl and coordd say to a new operator (issue 31 item 11), through a real coordd:
`msg read` after a `--keep` read, a backup to a path coordd's user cannot write, a
workflow sent over RPC with a bad node."""

from __future__ import annotations

import os
import subprocess

import pytest

from coordd import errors
from coordd.client import Client
from tests import ctlfork

pytestmark = pytest.mark.timeout(60)


def ctl(d, *args: str) -> subprocess.CompletedProcess[str]:
    """coordctl against `d`; stdout with its lines joined (rich wraps at 80 columns)."""
    got = ctlfork.run(["--socket", d.socket, *args], timeout=30)  # python -m coordctl
    got.stdout = " ".join(got.stdout.split())
    return got


async def test_msg_read_after_a_keep_read_says_how_many_are_held(daemon):
    async with Client(daemon.socket) as c:
        await c.update_agent_status("bob", "idle")  # an agent: coordd counts its inbox
    for i in range(3):
        assert ctl(daemon, "msg", "send", "--from", "alice", "--to", "bob", f"hi {i}"
                   ).returncode == 0
        assert ctl(daemon, "msg", "send", "--from", "alice", "--to", "carol", f"hi {i}"
                   ).returncode == 0
    kept = ctl(daemon, "msg", "read", "--as", "bob", "--keep")
    assert kept.returncode == 0 and "3 message(s); not acked" in kept.stdout, kept
    again = ctl(daemon, "msg", "read", "--as", "bob")
    assert again.returncode == 0, again
    assert "no messages to deliver to bob now: 3 read and not acked" in again.stdout, again
    assert "msg ack --as bob" in again.stdout
    # a reader that never reported a status: no count is kept, the reason is still said
    assert ctl(daemon, "msg", "read", "--as", "carol", "--keep").returncode == 0
    carol = ctl(daemon, "msg", "read", "--as", "carol")
    assert "read with --keep and not acked stay hidden" in carol.stdout, carol
    empty = ctl(daemon, "msg", "read", "--as", "dave")
    assert empty.stdout.strip() == "no messages for dave (messages read with --keep and not " \
        "acked stay hidden until their visibility timeout ends)"


def test_a_backup_to_a_path_coordd_cannot_write_names_path_and_user(daemon):
    got = ctl(daemon, "backup", "/sys/coordd-backup.db")  # EACCES for every user, root too
    assert got.returncode == 1, got
    assert "bad_request" in got.stderr and "/sys/coordd-backup.db" in got.stderr, got.stderr
    assert f"uid {os.geteuid()}" in got.stderr and "Permission denied" in got.stderr


def test_a_backup_into_proc_is_refused_naming_path_and_reason_and_logged(daemon):
    """/proc takes no new file (ENOENT on create): that was `internal`, never logged."""
    got = ctl(daemon, "backup", "/proc/coordd-backup.db")
    assert got.returncode == 1, got
    err = " ".join(got.stderr.split())
    assert "bad_request" in err and "/proc/coordd-backup.db cannot be written" in err, err
    assert "No such file or directory" in err and "internal" not in err, err
    assert "refused backup" in daemon.log() and "/proc/coordd-backup.db" in daemon.log()


def test_a_backup_under_a_file_says_it_is_not_a_folder(daemon, tmp_path):
    (tmp_path / "one.db").write_text("")
    got = ctl(daemon, "backup", str(tmp_path / "one.db" / "x.db"))
    assert got.returncode == 1, got
    err = " ".join(got.stderr.split())
    assert f"{tmp_path / 'one.db'} is not a folder" in err and "does not exist" not in err, err


async def test_a_workflow_over_rpc_names_the_bad_node(daemon):
    spec = {"name": "wf", "nodes": [
        {"name": "gather", "kind": "k", "required_role": "cpu"},
        {"name": "narrate", "kind": "k", "required_role": "cpu", "max_attempt": 3}]}
    async with Client(daemon.socket) as c:
        with pytest.raises(errors.BadRequest) as got:
            await c.call("workflow_submit", spec)
    assert 'in `nodes[1]` (the [[nodes]] table named "narrate")' in got.value.message, got.value
