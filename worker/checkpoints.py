"""A job's checkpoint files: which of them are whole, storing them, and the one a resume gets.

The rule this module keeps: a checkpoint record never names a file that was incomplete when
it was copied, and a resume is never handed a file whose sha256 and size differ from its
record. The model's side of the contract is docs/guides/writing-a-model.md ("Checkpoints");
models that break it (write in place, slowly, get killed mid-write) are handled here by
watching the files: a file is taken only once its (inode, size, mtime) held still for
`SETTLE_S` while the model ran and no process of the model's tree had it open for writing.

Blocking file I/O: call `resume`, `take` and `open_for_writing` from a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from coordd import errors
from coordd.cas import sha256_file, store_file
from coordd.client import CallTimeout, Client, Disconnected

logger = logging.getLogger(__name__)

SETTLE_S = 1.0
"""A file must keep its inode, size and mtime this long (seconds, monotonic) to be taken."""
CALL_TIMEOUT_S = 5.0
"""A `checkpoint` call not answered in this long is retried at the next scan."""
HISTORY = 2
"""Earlier records kept in a record's `previous` list, newest first (the resume fallbacks)."""
TEMP_SUFFIXES = (".tmp", ".partial", ".part", ".incomplete", "~")
"""Names ending so (or starting with a dot) are a model's files in progress: never taken."""
RUNNING, EXITED, CRASHED = "running", "exited", "crashed"
"""`take` modes: the model runs; it exited 0 by itself; it ended any other way."""


@dataclass(frozen=True)
class FileState:
    """What a scan saw of one file."""

    ino: int
    size: int
    mtime_ns: int


def end_mode(proc: Any) -> str:
    """The mode of the final scan after model process `proc` ended: EXITED when it exited 0
    (it finished), CRASHED otherwise (an exit 75 from a SIGTERM handler may have cut a write
    short; a crash; a signal): then only files already seen whole while it ran."""
    return EXITED if proc is not None and proc.returncode == 0 else CRASHED


async def start(directory: str, store: str, job_dir: str, job_id: str, checkpoint: Any,
                remote: Any = None) -> tuple[CheckpointRecorder, str]:
    """The recorder of a new attempt, and what its model resumes from: the verified copy of
    the job's `checkpoint` record (`CheckpointRecorder.resume`), or "". With `remote`
    (worker.remote_files.RemoteFiles: a worker on another host) the record's files are
    fetched from coordd first, and each new record's file is uploaded before it is sent."""
    rec = CheckpointRecorder(directory, store, job_id)
    if remote is not None:
        rec.push = remote.remote_record
        checkpoint = await remote.localize(checkpoint)
    if checkpoint is None:
        return rec, ""
    return rec, await asyncio.to_thread(rec.resume, job_dir, checkpoint)


def is_temp_name(name: str) -> bool:
    """True for names a model writes before renaming into place (`.x`, `x.tmp`, ...)."""
    return name.startswith(".") or name.endswith(TEMP_SUFFIXES)


def open_for_writing(pid: int) -> set[str] | None:
    """Real paths that model leader `pid` or any of its descendants hold open for writing.

    None when that cannot be known (the leader is gone or not readable): then no file is
    taken as whole on the strength of this answer.
    """
    try:
        leader = psutil.Process(pid)
        procs = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return None
    paths: set[str] = set()
    for i, proc in enumerate(procs):
        try:
            files = proc.open_files()
        except psutil.Error:
            if i == 0:
                return None  # the leader itself: unknown
            continue  # a helper that exited meanwhile
        paths.update(f.path for f in files if f.flags & (os.O_WRONLY | os.O_RDWR))
    return paths


def _ref(value: Any) -> dict[str, Any] | None:
    if (isinstance(value, dict) and isinstance(value.get("path"), str)
            and isinstance(value.get("sha256"), str) and isinstance(value.get("size"), int)):
        return {k: value[k] for k in ("path", "sha256", "size", "name") if k in value}
    return None


def refs_of(checkpoint: Any) -> list[dict[str, Any]]:
    """A record and its `previous` entries, newest first; entries without a path, sha256 and
    size (nothing to verify against) are left out."""
    out = [r for r in [_ref(checkpoint)] if r is not None]
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("previous"), list):
        out.extend(r for r in map(_ref, checkpoint["previous"]) if r is not None)
    return out


def verify_copy(ref: dict[str, Any], dest: str) -> str | None:
    """Copy the stored file of `ref` to `dest` and check the copy; the reason it is unusable,
    or None when the copy's sha256 and size are the record's."""
    try:
        shutil.copyfile(ref["path"], dest)
        sha, size = sha256_file(dest)
    except OSError as exc:
        return f"unreadable: {exc}"
    if (sha, size) != (ref["sha256"], ref["size"]):
        return f"sha256/size mismatch (file {sha[:12]}/{size}, record {ref['sha256'][:12]}/{ref['size']})"
    return None


@dataclass(eq=False)
class CheckpointRecorder:
    """The checkpoint folder of one attempt: what the scans saw, what was recorded.

    Args:
        directory: the model's COORD_CHECKPOINT_DIR.
        store: the content-addressed store the files are copied into.
        job_id: for log lines.
        settle_s: see `SETTLE_S`.
    """

    directory: str
    store: str
    job_id: str = ""
    settle_s: float = SETTLE_S
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    history: list[dict[str, Any]] = field(default_factory=list)
    """Records this attempt can fall back to, newest first (the last recorded one first)."""
    _first_seen: dict[str, tuple[FileState, float]] = field(default_factory=dict)
    _whole: dict[str, FileState] = field(default_factory=dict)
    _done: dict[str, FileState] = field(default_factory=dict)
    _pending: tuple[str, FileState, dict[str, Any]] | None = None
    push: Callable[[dict[str, Any]], Awaitable[None]] | None = None
    """Uploads a record's file to coordd and points it there (a remote worker), or None."""

    def resume(self, job_dir: str, checkpoint: Any) -> str:
        """Copy the newest recorded checkpoint whose copy verifies into `job_dir/resume/`;
        return its path, or "" when none does (the model starts fresh). Older entries are
        tried in turn; the verified one and those after it become this attempt's history."""
        refs = refs_of(checkpoint)
        if checkpoint is not None and not refs:
            logger.warning("checkpoint record %.200r names no verifiable file, starting fresh",
                           checkpoint, extra={"action": "resume_unverifiable"})
        for i, ref in enumerate(refs):
            name = os.path.basename(str(ref.get("name") or ref["path"])) or "checkpoint"
            dest = os.path.join(job_dir, "resume", name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            why = verify_copy(ref, dest)
            if why is None:
                self.history = refs[i:i + 1 + HISTORY]
                if i:
                    logger.warning("resuming from an older checkpoint %s", ref["sha256"][:12],
                                   extra={"action": "resume_fallback", "sha256": ref["sha256"]})
                return dest
            with contextlib.suppress(OSError):
                os.unlink(dest)
            logger.warning("checkpoint %s not handed over: %s", ref["path"], why,
                           extra={"action": "resume_corrupt", "sha256": ref["sha256"]})
        return ""

    async def record(self, client: Client, worker_id: str, token: int, proc: Any, mode: str,
                     now: float, holds: Callable[[], bool]) -> Exception | None:
        """Scan (at monotonic `now`), store and send the newest whole new file (`checkpoint`,
        fenced by `token`) while `holds()` (the lease); model process `proc` has `.pid` and
        `.returncode`.

        Returns:
            The call's error for the caller to act on (a lease error, coordd unreachable;
            any other refusal is logged), or None (recorded, or nothing to record).
        """
        async with self.lock:
            ref = await self.scan(now, proc.pid, lambda: proc.returncode is None, mode)
            if ref is None or not holds():
                return None
            try:
                if self.push is not None:
                    await self.push(ref)  # the file into coordd's store first
                await asyncio.wait_for(client.checkpoint(self.job_id, worker_id, token, ref),
                                       CALL_TIMEOUT_S)
            except OSError as exc:
                logger.warning("job %s: checkpoint file unreadable: %s", self.job_id, exc,
                               extra={"action": "checkpoint_retry", "job_id": self.job_id})
                return None
            except (errors.CoordError, TimeoutError) as exc:
                if not isinstance(exc, (Disconnected, CallTimeout, TimeoutError, errors.LeaseLost,
                                        errors.LeaseExpired, errors.NotFound,
                                        errors.AlreadyCompleted)):
                    logger.warning("job %s: checkpoint not recorded (will retry): %s",
                                   self.job_id, exc,
                                   extra={"action": "checkpoint_retry", "job_id": self.job_id})
                return exc
            self.recorded(ref)
            logger.info("job %s: checkpoint %s recorded", self.job_id, ref["name"],
                        extra={"action": "checkpoint", "job_id": self.job_id,
                               "sha256": ref["sha256"]})
            return None

    async def scan(self, now: float, pid: int, running: Callable[[], bool], mode: str = RUNNING
                   ) -> dict[str, Any] | None:
        """`take` in a thread, asking `open_for_writing(pid)` while `running()`; None also when
        the store is not writable (logged; the file is tried again at the next scan). Hold
        `lock`; if the caller is cancelled this still waits for the thread (it owns the state).
        """
        job = asyncio.ensure_future(asyncio.to_thread(
            self.take, now, lambda: open_for_writing(pid) if running() else None, mode))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            await asyncio.wait([job])
            raise
        except OSError as exc:  # store unwritable or full: the job runs on
            logger.warning("job %s: cannot store checkpoint: %s", self.job_id, exc,
                           extra={"action": "checkpoint_store_error", "job_id": self.job_id})
            return None

    def take(self, now: float, writing: Callable[[], set[str] | None] | None = None,
             mode: str = RUNNING) -> dict[str, Any] | None:
        """Scan the folder; store the newest whole file not recorded yet and return the record
        to send (`recorded` once coordd took it), or None.

        Args:
            now: monotonic seconds.
            writing: returns `open_for_writing` of the running model (called at most once,
                and only when a file has held still); None: unknown, nothing is taken.
            mode: RUNNING; EXITED (every file is whole: the model exited 0 by itself and
                its tree is gone); CRASHED (only files already seen whole while it ran).
        """
        states = self._scan()
        whole: list[tuple[int, str, FileState]] = []
        open_now: set[str] | None = None
        for name, st in states.items():
            if self._done.get(name) == st:
                continue
            if mode == EXITED or (mode == CRASHED and self._whole.get(name) == st):
                whole.append((st.mtime_ns, name, st))
                continue
            seen = self._first_seen.get(name)
            if seen is None or seen[0] != st:
                self._first_seen[name] = (st, now)
                continue
            if mode != RUNNING or now - seen[1] < self.settle_s or writing is None:
                continue
            if open_now is None:
                open_now = writing()
                if open_now is None:
                    writing = None
                    continue
            if os.path.realpath(os.path.join(self.directory, name)) in open_now:
                continue  # held still, but the model is writing it (slowly, or stopped)
            self._whole[name] = st
            whole.append((st.mtime_ns, name, st))
        if not whole:
            return None
        whole.sort()
        for _, name, st in whole[:-1]:
            self._done[name] = st  # superseded by a newer whole file
        _, name, st = whole[-1]
        if self._pending is not None and self._pending[:2] == (name, st):
            return self._pending[2]
        record = self._store(name, st)
        if record is not None:
            self._pending = (name, st, record)
        return record

    def recorded(self, record: dict[str, Any]) -> None:
        """coordd accepted `record`: its file is done, and it heads the history."""
        if self._pending is not None and self._pending[2] is record:
            self._done[self._pending[0]] = self._pending[1]
            self._pending = None
        self.history = [_ref(record) or record, *self.history][:1 + HISTORY]

    def _scan(self) -> dict[str, FileState]:
        states: dict[str, FileState] = {}
        try:
            with os.scandir(self.directory) as it:
                for entry in it:
                    if is_temp_name(entry.name):
                        continue
                    try:
                        if entry.is_file(follow_symlinks=False):
                            s = entry.stat(follow_symlinks=False)
                            states[entry.name] = FileState(s.st_ino, s.st_size, s.st_mtime_ns)
                    except FileNotFoundError:
                        continue
        except FileNotFoundError:
            pass
        return states

    def _store(self, name: str, st: FileState) -> dict[str, Any] | None:
        """Copy into the store; None (tried again at the next scan) if the file changed
        while it was copied or the stored copy does not read back with the same hash.

        Raises:
            OSError: the store is not writable (the file is tried again later).
        """
        path = os.path.join(self.directory, name)
        try:
            stored = store_file(self.store, path)
            s = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            self._done[name] = st  # the model pruned it before we got to it
            return None
        if FileState(s.st_ino, s.st_size, s.st_mtime_ns) != st or stored.size != st.size:
            logger.info("checkpoint %s changed while it was copied; taken later", name,
                        extra={"action": "checkpoint_changed"})
            self._first_seen.pop(name, None)
            self._whole.pop(name, None)
            return None
        if sha256_file(stored.path) != (stored.sha256, stored.size):
            logger.warning("stored checkpoint %s does not read back as written", stored.path,
                           extra={"action": "checkpoint_store_corrupt"})
            return None
        return {"path": stored.path, "sha256": stored.sha256, "size": stored.size, "name": name,
                "previous": list(self.history[:HISTORY])}
