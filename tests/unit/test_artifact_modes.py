"""The artifact store shared by two users (issue 14 follow-up): under systemd coordd runs as
`coordd` and the workers as `coord-worker` in coordd's group. Files a worker stores must be
readable by coordd (backup, checkpoint hand-over) and its folders writable by the group
(prune), whatever the worker's umask; a backup tells an unreadable file apart from an
absent or damaged one."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordctl.commands import missing_artifacts_message
from coordd import cas
from coordd.store.sqlite import backup
from coordd.wire.protocol import BackupResult

COORDD_UID, WORKER_UID, GROUP = 40100, 40101, 40100  # uids no real account uses


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_store_writes_group_readable_files_and_group_writable_folders_whatever_the_umask(
        tmp_path):
    src = tmp_path / "result.bin"
    src.write_bytes(b"x" * 100)
    old = os.umask(0o077)  # the strictest umask a worker might run with
    try:
        stored = cas.store_file(str(tmp_path / "store"), str(src))
        cas.write_atomic(str(tmp_path / "manifest.json"), b"{}")
    finally:
        os.umask(old)
    assert _mode(stored.path) == cas.FILE_MODE == 0o640
    assert _mode(os.path.dirname(stored.path)) == cas.STORE_DIR_MODE == 0o2770
    assert _mode(tmp_path / "store") == 0o2770
    assert _mode(tmp_path / "manifest.json") == 0o640
    assert [n for n in os.listdir(tmp_path / "store") if n.startswith(".tmp")] == []


def _as_user(uid: int, groups: list[int], umask: int, fn: Callable[[], object]) -> object:
    """Run `fn` in a forked child as `uid` (primary group groups[0], all of `groups`), with
    `umask`; return what it returned (JSON), or raise what it raised, by name."""
    rfd, wfd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork beside threads (3.12)
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(rfd)
            os.setgroups(groups)
            os.setgid(groups[0])
            os.setuid(uid)
            os.umask(umask)
            out = {"ok": fn()}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = {"error": type(exc).__name__, "message": str(exc)}
        try:
            os.write(wfd, json.dumps(out).encode())
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    got = json.loads(data)
    if "error" in got:
        raise AssertionError(f"as uid {uid}: {got['error']}: {got['message']}")
    return got["ok"]


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A folder both test users can reach (pytest's tmp_path is root's, mode 0700), with
    the store made as coordd makes it: owned by coordd, mode 2770."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as two users")
    root = Path(tempfile.mkdtemp(prefix="coordd-modes-"))
    try:
        os.chmod(root, 0o755)
        store = root / "artifacts"
        store.mkdir()
        os.chown(store, COORDD_UID, GROUP)
        os.chmod(store, 0o2770)
        dest = root / "backups"
        dest.mkdir()
        os.chown(dest, COORDD_UID, GROUP)
        yield root
    finally:
        shutil.rmtree(root)


def test_coordd_reads_backs_up_and_prunes_what_a_worker_of_its_group_stored(shared_root):
    store, src = str(shared_root / "artifacts"), shared_root / "model-output.bin"
    src.write_bytes(os.urandom(4096))
    os.chmod(src, 0o644)
    stored = _as_user(WORKER_UID, [WORKER_UID, GROUP], 0o022,  # the unit's default umask
                      lambda: cas.store_file(store, str(src)).__dict__)
    assert isinstance(stored, dict)
    sha, path = stored["sha256"], stored["path"]
    assert os.stat(path).st_uid == WORKER_UID and os.stat(path).st_gid == GROUP
    assert os.stat(os.path.dirname(path)).st_gid == GROUP  # setgid folder: the group is kept
    assert _as_user(COORDD_UID, [GROUP], 0o027, lambda: cas.sha256_file(path)[0]) == sha
    dest = str(shared_root / "backups" / "bk.db.artifacts")
    assert _as_user(COORDD_UID, [GROUP], 0o027,
                    lambda: backup._copy_problem(path, dest, sha)) is None
    assert _as_user(COORDD_UID, [GROUP], 0o027,
                    lambda: cas.sweep(store, set(), before=float("inf"))) == 1
    assert not os.path.exists(path)


def test_backup_tells_an_unreadable_artifact_from_an_absent_or_damaged_one(shared_root):
    dest = str(shared_root / "backups" / "bk.db.artifacts")
    folder = shared_root / "artifacts" / "ab"
    folder.mkdir()
    os.chmod(folder, 0o755)
    private = folder / ("ab" + "1" * 62)  # a worker's file as mkstemp left it: 0600
    private.write_bytes(b"secret")
    os.chown(private, WORKER_UID, WORKER_UID)
    os.chmod(private, 0o600)
    damaged = folder / ("ab" + "2" * 62)
    damaged.write_bytes(b"not what the name says")
    os.chmod(damaged, 0o644)
    absent = folder / ("ab" + "3" * 62)

    def problems() -> list[str | None]:
        return [backup._copy_problem(str(p), dest, p.name) for p in (private, damaged, absent)]

    assert _as_user(COORDD_UID, [GROUP], 0o027, problems) == [
        backup.UNREADABLE, backup.DAMAGED, backup.ABSENT]


def test_backup_message_names_unreadable_files_apart_from_absent_or_damaged_ones():
    res = BackupResult(path="/b/x.db", bytes=1, quick_check="ok", jobs=3,
                       missing_artifacts=["a" * 64, "b" * 64, "c" * 64],
                       missing_reasons={"a" * 64: backup.UNREADABLE, "b" * 64: backup.UNREADABLE,
                                        "c" * 64: backup.ABSENT})
    text = missing_artifacts_message(res)
    assert text.startswith("3 referenced artifact file(s) not copied: ")
    assert f"2 unreadable (permission denied): {'a' * 64}, {'b' * 64}" in text
    assert f"1 absent: {'c' * 64}" in text
    assert "group-readable" in text and "absent or damaged" not in text
    old = BackupResult(path="/b/x.db", bytes=1, quick_check="ok", jobs=3,
                       missing_artifacts=["c" * 64])  # from a coordd without the reasons
    assert missing_artifacts_message(old) == (
        f"1 referenced artifact file(s) not copied: 1 absent or damaged: {'c' * 64}")


def test_sweep_keeps_going_past_a_file_it_may_not_delete(shared_root):
    store = shared_root / "artifacts"
    locked, open_ = store / "aa", store / "bb"  # a folder from before the fix: 2755
    for folder in (locked, open_):
        folder.mkdir()
        (folder / (folder.name + "0" * 62)).write_bytes(b"old")
    os.chown(locked, WORKER_UID, GROUP)
    os.chmod(locked, 0o2755)
    os.chown(open_, WORKER_UID, GROUP)
    os.chmod(open_, 0o2770)
    assert _as_user(COORDD_UID, [GROUP], 0o027,
                    lambda: cas.sweep(str(store), set(), before=float("inf"))) == 1
    assert os.listdir(locked) and not os.listdir(open_)
