"""Records of the model process groups a worker runs, and the kill of a dead worker's ones.

Each model's group is written down under the worker's work_dir (one small file per group:
pgid, the leader's start time, the boot it belongs to, the job) while it runs. A worker
that was SIGKILLed cannot clean up: its model leader dies by the parent-death signal
(worker.launch), but helpers in the group live on. The next start of the same worker id
kills, first, every group its predecessor left recorded. The rule: never kill a group
that is not ours — a pgid is only ours while its leader (or, once the leader is gone, a
member) started no earlier than the recorded leader, in the same boot.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from typing import Any

import psutil

from worker import artifacts

logger = logging.getLogger(__name__)

RECORDS_DIR = ".groups"
START_SLACK_S = 0.05  # psutil start times are rounded to clock ticks
BOOT_SLACK_S = 2.0  # boot_time() is derived from uptime and drifts by a little
KILL_WAIT_S = 3.0


def records_dir(work_dir: str, worker_id: str) -> str:
    """Where `worker_id`'s group records live (work_dir may be shared by several ids)."""
    return os.path.join(work_dir, RECORDS_DIR, artifacts.safe_name(worker_id))


class WorkerRunning(Exception):
    """Another live process runs this worker id on this work_dir."""


def lock(folder: str) -> int:
    """Hold `folder`'s lock for this process's life (the kernel drops it when we die);
    return its fd. Taken before `kill_recorded`, so a live twin's models are never killed.

    Raises:
        WorkerRunning: the lock is held.
        OSError: the folder cannot be created.
    """
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise WorkerRunning(f"another process runs this worker id ({folder}/lock is held)") \
            from None
    return fd


def unlock(fd: int | None) -> None:
    """Release a `lock`."""
    if fd is not None:
        os.close(fd)


def record(folder: str, pid: int, job_id: str) -> str | None:
    """Write down the group led by `pid` (pid == pgid); return the record's path, or None
    if it could not be written (logged: the parent-death signal still covers the leader)."""
    try:
        proc = psutil.Process(pid)
        entry = {"pgid": pid, "start_time": proc.create_time(), "boot_time": psutil.boot_time(),
                 "job_id": job_id}
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, f"{pid}.json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(entry, fh)
        os.replace(tmp, path)
        return path
    except (OSError, psutil.Error) as exc:
        logger.warning("cannot record model group %d: %s", pid, exc,
                       extra={"action": "group_record_error", "pgid": pid})
        return None


def forget(path: str | None) -> None:
    """Drop a record once its group is gone."""
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot remove group record %s: %s", path, exc,
                           extra={"action": "group_record_error"})


def kill_recorded(folder: str) -> list[dict[str, Any]]:
    """SIGKILL every group a previous run left recorded in `folder` (ours only: see the
    module docstring), wait until its processes are gone, and remove the records.
    Returns the records whose group still had processes. Blocking: run it in a thread."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    boot = psutil.boot_time()
    killed = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as fh:
                entry = json.load(fh)
            pgid, start = int(entry["pgid"]), float(entry["start_time"])
            same_boot = abs(float(entry["boot_time"]) - boot) <= BOOT_SLACK_S
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("unreadable group record %s: %s", path, exc,
                           extra={"action": "group_record_error"})
            forget(path)
            continue
        procs = _ours(pgid, start) if same_boot else []
        if procs:
            logger.warning("killing %d process(es) of model group %d (job %s) left by a "
                           "previous run of this worker", len(procs), pgid, entry.get("job_id"),
                           extra={"action": "orphan_kill", "pgid": pgid,
                                  "job_id": entry.get("job_id"),
                                  "pids": [p.pid for p in procs]})
            for p in procs:
                try:
                    p.kill()  # psutil checks the pid still names the same process
                except psutil.Error:
                    pass
            _gone, alive = psutil.wait_procs(procs, timeout=KILL_WAIT_S)
            if alive:
                logger.error("model group %d: %d process(es) survived SIGKILL", pgid,
                             len(alive), extra={"action": "orphan_survivors", "pgid": pgid})
            killed.append(entry)
        forget(path)
    return killed


def _ours(pgid: int, start: float) -> list[psutil.Process]:
    """The live members of group `pgid` that belong to the recorded group: none if its
    leader runs with another start time (the pid was reused), else members started no
    earlier than the recorded leader."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != pgid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            created = proc.create_time()
        except (OSError, psutil.Error):
            continue
        if proc.pid == pgid and abs(created - start) > START_SLACK_S:
            return []  # a new process under the old number: not ours
        if created >= start - START_SLACK_S:
            members.append(proc)
    return members
