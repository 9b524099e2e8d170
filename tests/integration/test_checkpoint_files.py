"""worker.checkpoints against real model processes writing their files in every bad way:
in place and slowly, stopped mid-write, SIGKILLed mid-write; and the resume side: a record
whose stored file is corrupt or missing is never handed over. Time is injected (`now`), the
processes and files are real."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from coordd import cas
from worker import checkpoints
from worker.checkpoints import CRASHED, EXITED, CheckpointRecorder, open_for_writing

WHOLE = b"head:" + b"x" * 50_000 + b":tail\n"

# Writes the first half of argv[1] in place, says so on stdout, then waits for a line on
# stdin before writing the rest and closing it (the fd stays open meanwhile).
WRITER = textwrap.dedent("""
    import sys
    data = open(sys.argv[2], "rb").read()
    with open(sys.argv[1], "wb") as fh:
        fh.write(data[: len(data) // 2])
        fh.flush()
        print("half", flush=True)
        sys.stdin.readline()
        fh.write(data[len(data) // 2:])
    print("done", flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def setup(tmp_path: Path):
    ckpt, store = tmp_path / "ckpt", tmp_path / "store"
    ckpt.mkdir()
    src = tmp_path / "whole.bin"
    src.write_bytes(WHOLE)
    procs: list[subprocess.Popen] = []

    def writer(name: str = "ckpt-1") -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(ckpt / name), str(src)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        procs.append(p)
        assert p.stdout.readline() == b"half\n"
        return p

    yield ckpt, CheckpointRecorder(str(ckpt), str(store)), writer
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(5)
        p.stdin.close()
        p.stdout.close()


def probe(proc: subprocess.Popen):
    return lambda: open_for_writing(proc.pid)


@pytest.mark.parametrize("how", ["slow", "stopped"])
def test_file_held_open_for_writing_is_never_taken_however_long_it_holds_still(setup, how):
    ckpt, rec, writer = setup
    p = writer()
    if how == "stopped":  # SIGSTOP mid-write (a suspended job): still and silent, yet partial
        os.kill(p.pid, signal.SIGSTOP)
    for now in (0.0, 5.0, 60.0, 3600.0):
        assert rec.take(now, probe(p)) is None
    if how == "stopped":
        os.kill(p.pid, signal.SIGCONT)
    p.stdin.write(b"go\n")
    p.stdin.flush()
    assert p.stdout.readline() == b"done\n"  # written whole and closed; the writer still runs
    assert rec.take(3600.0, probe(p)) is None  # changed since the last scan: watched afresh
    assert rec.take(3600.5, probe(p)) is None  # not still for SETTLE_S yet
    got = rec.take(3601.0, probe(p))
    assert got is not None and got["sha256"] == hashlib.sha256(WHOLE).hexdigest()
    assert Path(got["path"]).read_bytes() == WHOLE and got["size"] == len(WHOLE)
    rec.recorded(got)
    assert rec.take(4000.0, probe(p)) is None  # recorded once


def test_sigkilled_mid_write_file_is_never_taken_after_the_crash(setup):
    ckpt, rec, writer = setup
    p = writer()
    assert rec.take(0.0, probe(p)) is None
    assert rec.take(10.0, probe(p)) is None  # still, but open for writing
    p.kill()
    p.wait(5)
    assert (ckpt / "ckpt-1").stat().st_size == len(WHOLE) // 2
    assert rec.take(20.0, probe(p)) is None  # the writer is gone: who writes is unknown
    assert rec.take(30.0, None) is None
    assert rec.take(40.0, None, CRASHED) is None  # the final scan after a crash


def test_file_changing_between_scans_is_not_taken_until_still(tmp_path):
    ckpt = tmp_path / "c"
    ckpt.mkdir()
    rec = CheckpointRecorder(str(ckpt), str(tmp_path / "s"))
    nobody: set[str] = set()
    f = ckpt / "latest.pt"  # one name, appended to by open/write/close (never held open)
    for i, now in enumerate((0.0, 2.0, 4.0)):
        with open(f, "ab") as fh:
            fh.write(b"%d" % i)
        assert rec.take(now, lambda: nobody) is None
    got = rec.take(5.0, lambda: nobody)
    assert got is not None and Path(got["path"]).read_bytes() == b"012"
    rec.recorded(got)
    f.write_bytes(b"rewritten in place")  # the same name rewritten: a new checkpoint
    assert rec.take(6.0, lambda: nobody) is None
    again = rec.take(7.0, lambda: nobody)
    assert again is not None and Path(again["path"]).read_bytes() == b"rewritten in place"
    assert again["previous"] == [{k: got[k] for k in ("path", "sha256", "size", "name")}]


def test_temp_names_are_never_taken_and_a_clean_exit_takes_the_newest_at_once(tmp_path):
    ckpt = tmp_path / "c"
    ckpt.mkdir()
    rec = CheckpointRecorder(str(ckpt), str(tmp_path / "s"))
    for name in (".ckpt-3", "ckpt-3.tmp", "ckpt-3.partial", "ckpt-3.part", "ckpt-3~"):
        (ckpt / name).write_bytes(b"in progress")
    assert rec.take(0.0, set, EXITED) is None
    (ckpt / "ckpt-1").write_bytes(b"one")
    os.utime(ckpt / "ckpt-1", ns=(1, 1))
    (ckpt / "ckpt-2").write_bytes(b"two")
    got = rec.take(0.0, None, EXITED)  # exited 0/75 by itself: what it left is whole
    assert got is not None and got["name"] == "ckpt-2"


def test_crashed_final_scan_takes_only_files_seen_whole_while_running(setup):
    ckpt, rec, writer = setup
    p = writer("ckpt-2")  # in progress when the model dies
    (ckpt / "ckpt-1").write_bytes(b"one")
    os.utime(ckpt / "ckpt-1", ns=(1, 1))
    assert rec.take(0.0, probe(p)) is None
    got = rec.take(2.0, probe(p))  # ckpt-1 is still and closed; ckpt-2 is open
    assert got is not None and got["name"] == "ckpt-1"  # not recorded yet (coordd down, say)
    p.kill()
    p.wait(5)
    again = rec.take(3.0, None, CRASHED)
    assert again is got  # the same stored copy, not copied twice; never ckpt-2


def _stored(store: Path, data: bytes, name: str) -> dict:
    src = store.parent / f"src-{name}"
    src.write_bytes(data)
    f = cas.store_file(str(store), str(src))
    return {"path": f.path, "sha256": f.sha256, "size": f.size, "name": name}


def test_resume_verifies_sha256_and_falls_back_to_the_previous_good_one(tmp_path):
    store = tmp_path / "store"
    old, mid, new = (_stored(store, d, n) for d, n in
                     ((b"old", "ckpt-1"), (b"mid" * 10, "ckpt-2"), (b"new" * 10, "ckpt-3")))
    with open(new["path"], "r+b") as fh:  # bit rot / a torn copy in the store
        fh.write(b"N")
    os.unlink(mid["path"])  # pruned or on another machine
    record = {**new, "previous": [mid, old]}
    rec = CheckpointRecorder(str(tmp_path / "c"), str(store))
    job = tmp_path / "job"
    path = rec.resume(str(job), record)
    assert Path(path).read_bytes() == b"old" and Path(path).name == "ckpt-1"
    assert rec.history == [old]
    assert not (job / "resume" / "ckpt-3").exists()  # the bad copy is not left lying about

    os.unlink(old["path"])
    rec2 = CheckpointRecorder(str(tmp_path / "c"), str(store))
    assert rec2.resume(str(tmp_path / "job2"), record) == ""  # none good: start fresh
    assert rec2.resume(str(tmp_path / "job3"), {"step": 3}) == ""  # nothing to verify against
    assert rec2.resume(str(tmp_path / "job4"), {"path": new["path"]}) == ""  # no sha256
    assert rec2.resume(str(tmp_path / "job5"), None) == ""


def test_store_copy_is_discarded_when_the_file_changes_while_copied(tmp_path, monkeypatch):
    ckpt = tmp_path / "c"
    ckpt.mkdir()
    f = ckpt / "ckpt-1"
    f.write_bytes(b"first")
    rec = CheckpointRecorder(str(ckpt), str(tmp_path / "s"))
    real = checkpoints.store_file

    def racing(root: str, src: str):
        stored = real(root, src)
        with open(src, "ab") as fh:  # the model appends right after our copy
            fh.write(b" and more")
        return stored
    monkeypatch.setattr(checkpoints, "store_file", racing)
    assert rec.take(0.0, set) is None
    assert rec.take(2.0, set) is None  # taken after the copy: it changed under us
    monkeypatch.setattr(checkpoints, "store_file", real)
    assert rec.take(4.0, set) is None  # watched afresh
    got = rec.take(6.0, set)
    assert got is not None and Path(got["path"]).read_bytes() == b"first and more"


def test_open_for_writing_sees_the_models_helpers(tmp_path):
    target = tmp_path / "held"
    helper = f"import time; f = open({str(target)!r}, 'wb'); time.sleep(60)"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {helper!r}]); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while str(target) not in (open_for_writing(p.pid) or set()):
            assert time.monotonic() < deadline, "the helper's open file was never seen"
            time.sleep(0.05)
    finally:
        for kid in psutil.Process(p.pid).children(recursive=True):
            kid.kill()
        p.kill()
        p.wait(5)
    assert open_for_writing(p.pid) is None  # gone: unknown
