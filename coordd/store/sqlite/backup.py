"""Backups that restore: a consistent copy of the database, the artifact files it refers to,
and a manifest of their sha256; and the offline restore that verifies all of it first.

Layout of a backup at DEST: `DEST` (the SQLite copy, one self-contained file),
`DEST.artifacts/<sha[:2]>/<sha256>` (every artifact and checkpoint file the copy refers to)
and `DEST.manifest.json` (`{"db": {"sha256", "bytes"}, "artifacts": [{"sha256", "bytes"}],
"missing": [sha256...], "missing_reasons": {sha256: why}}`), written last: a backup
without its manifest is incomplete.

`restore` runs with coordd stopped (it takes the lock coordd holds while it runs:
coordd.store.sqlite.dblock), checks `quick_check` and every hash, installs the artifact files
first and the database second (a database it replaces is kept beside it, `<db>.replaced-<UTC
time>`), and points the copy's artifact and checkpoint paths at the artifact store beside the
restored database. Anything that does not verify refuses the whole restore.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import logging
import os
import pwd
import secrets
import shutil
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from coordd import cas, errors
from coordd.net import fdlimit
from coordd.store import views
from coordd.clock import SystemClock
from coordd.store.sqlite.dblock import DbLock
from coordd.store import reads
from coordd.store.schema import SCHEMA_VERSION
from coordd.wire.protocol import BackupResult
from coordd.store.sqlite.storage_health import storage_reason

logger = logging.getLogger(__name__)
# errno of creating the backup's first file that say the path takes none (EACCES, EPERM,
# EROFS are answered with coordd's user; the host's own troubles are `unavailable`)
UNWRITABLE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EINVAL,
                        errno.ENAMETOOLONG, errno.ELOOP, errno.EOPNOTSUPP, errno.ENXIO})

MANIFEST_SUFFIX = ".manifest.json"
ARTIFACTS_SUFFIX = ".artifacts"


class RestoreRefused(errors.CoordError):
    """The backup did not verify, or coordd is running on the target; nothing was changed."""

    code = "restore_refused"


@contextlib.contextmanager
def db_lock(db_path: str) -> Iterator[str]:
    """Hold the database's lock for the block (coordd holds it while it runs, restore too),
    on the file however it is named (coordd.store.sqlite.dblock); yields the resolved path.

    Raises:
        errors.InvalidState: another process (a coordd, a restore) holds it.
    """
    with DbLock(db_path) as lock:
        yield lock.real


ABSENT = "absent"
UNREADABLE = "unreadable (permission denied)"
DAMAGED = "damaged (its bytes do not hash to its sha256)"


def _copy_verified(src: str, root: str, sha: str) -> bool:
    """Copy `src` into the store at `root`; True only if its bytes hash to `sha`."""
    return _copy_problem(src, root, sha) is None


def _copy_problem(src: str, root: str, sha: str) -> str | None:
    """Copy `src` into the store at `root`; None if its bytes hash to `sha`, else why not:
    ABSENT, UNREADABLE (this process may not read it: another user's file or folder),
    DAMAGED, or `not copied: <error>` (the copy could not be written)."""
    try:
        stored = cas.store_file(root, src)
    except OSError as exc:
        if exc.filename == src and isinstance(exc, FileNotFoundError):
            return ABSENT
        if exc.filename == src and isinstance(exc, PermissionError):
            return UNREADABLE
        return f"not copied: {exc.strerror or exc}"
    if stored.sha256 != sha:
        os.unlink(stored.path)
        return DAMAGED
    return None


def backup(db_path: str, artifact_dir: str, dest: str) -> BackupResult:
    """Write a verified backup at `dest` while coordd keeps serving (see the module doc).

    The database is copied with SQLite's backup API in one step (one consistent snapshot),
    fsynced and renamed into place, then opened on its own connection for `quick_check`.

    Raises:
        errors.BadRequest: `dest` exists, its folder does not (or is not a folder), the
            folder takes no new file (/proc), or coordd's user may not write there (the
            message names the path, the OS's reason and, for a permission, the user).
        errors.Unavailable: the host refused (out of file descriptors, disk full, I/O
            error); nothing is left at `dest`: retry later.
        errors.CoordError: the copy failed or did not pass `quick_check` (it is removed).
    Every refusal but a BadRequest is logged here (the RPC layer logs those).
    """
    try:
        return _backup(db_path, artifact_dir, dest)
    except errors.CoordError as exc:
        if exc.code != "bad_request":  # quick_check failed
            _log_failure(dest, exc)
        raise
    except (OSError, sqlite3.Error) as exc:
        dest = os.path.abspath(dest)
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise errors.BadRequest(
                f"backup: coordd runs as {running_as()}, which cannot write {dest}: "
                f"{exc.strerror}; choose a folder that user can write (or let it write "
                f"there); nothing was written") from exc
        with contextlib.suppress(OSError):
            os.unlink(dest)
        shutil.rmtree(dest + ARTIFACTS_SUFFIX, ignore_errors=True)
        refusal = _refusal(exc, dest)
        _log_failure(dest, refusal)
        raise refusal from exc


def _log_failure(dest: str, exc: errors.CoordError) -> None:
    logger.error("backup to %s failed: %s: %s", os.path.abspath(dest), exc.code, exc.message,
                 extra={"action": "backup_failed", "code": exc.code})


def running_as() -> str:
    """`user NAME (uid N)` of this process (the uid alone if it has no name)."""
    uid = os.geteuid()
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _refusal(exc: BaseException, dest: str) -> errors.CoordError:
    """The error a failed backup answers: `unavailable` with the reason when the host
    refused (out of descriptors, disk full, I/O), else `internal` naming the error."""
    if fdlimit.is_exhaustion(exc) or fdlimit.out_of_fds():
        fdlimit.note_exhaustion(exc if fdlimit.is_exhaustion(exc) else
                                OSError(errno.EMFILE, str(exc)), "backup")
        return errors.Unavailable(f"backup refused: {fdlimit.OUT_OF_FDS} (limit "
                                  f"{fdlimit.current_limit()}); nothing was written, retry "
                                  "once clients have closed connections")
    reason = storage_reason(exc)
    if reason is None and isinstance(exc, OSError) and exc.errno in (errno.ENOSPC,
                                                                      errno.EDQUOT):
        reason = "disk full"
    if reason is not None:
        return errors.Unavailable(f"{reason}: backup to {dest} failed, nothing was written "
                                  f"({exc})")
    return errors.CoordError(f"backup to {dest} failed: {exc}")


def _backup(db_path: str, artifact_dir: str, dest: str) -> BackupResult:
    dest = os.path.abspath(dest)
    dest_dir = os.path.dirname(dest)
    if not os.path.isdir(dest_dir):
        if os.path.lexists(dest_dir):
            raise errors.BadRequest(f"backup: {dest_dir} is not a folder")
        raise errors.BadRequest(f"backup: folder {dest_dir} does not exist")
    if any(os.path.exists(dest + s) for s in ("", MANIFEST_SUFFIX, ARTIFACTS_SUFFIX)):
        raise errors.BadRequest(f"backup: {dest} (or its manifest) exists; choose a new path")
    tmp = f"{dest}.tmp-{secrets.token_hex(4)}"
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    except OSError as exc:  # the folder takes no new file (/proc, a bad name): the path's fault
        if exc.errno not in UNWRITABLE:
            raise
        raise errors.BadRequest(f"backup: {dest} cannot be written: {exc.strerror}; choose "
                                "a path in an ordinary folder; nothing was written") from exc
    try:  # (made first: the OS's reason, which SQLite's "unable to open" hides)
        src = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)  # pages=-1: one step, one consistent snapshot
                dst.execute("PRAGMA journal_mode=DELETE")
            finally:
                dst.close()
        finally:
            src.close()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.rename(tmp, dest)
        cas.fsync_dir(dest_dir)
    except (OSError, sqlite3.Error):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    check = sqlite3.connect(f"file:{dest}?mode=ro", uri=True)
    try:
        qc = views.integrity(check)[0]
        jobs = views.count_jobs(check)
        refs = views.artifact_refs(check)
    finally:
        check.close()
    if qc != "ok":
        os.unlink(dest)
        raise errors.CoordError(f"backup copy failed quick_check ({qc}); removed")
    copied, problems = [], {}
    for sha, path in sorted(refs.items()):
        why = _copy_problem(path, dest + ARTIFACTS_SUFFIX, sha)
        if why is None:
            copied.append(sha)
        else:
            problems[sha] = why
    missing = sorted(problems)
    if problems:
        logger.warning("backup %s: %d referenced artifact file(s) not copied: %s", dest,
                       len(problems), "; ".join(f"{s[:12]} {w}" for s, w in
                                                list(problems.items())[:3]),
                       extra={"action": "backup_artifacts_missing", "n": len(problems)})
    db_sha, db_bytes = cas.sha256_file(dest)
    arts = dest + ARTIFACTS_SUFFIX
    manifest = {"db": {"sha256": db_sha, "bytes": db_bytes},
                "artifacts": [{"sha256": s, "bytes": os.stat(_in_store(arts, s)).st_size}
                              for s in copied],
                "missing": missing, "missing_reasons": problems}
    cas.write_atomic(dest + MANIFEST_SUFFIX, json.dumps(manifest, indent=1).encode())
    return BackupResult(path=dest, bytes=db_bytes, quick_check=qc, jobs=jobs,
                        artifacts=len(copied), missing_artifacts=missing,
                        manifest=dest + MANIFEST_SUFFIX, missing_reasons=problems)


def _in_store(root: str, sha: str) -> str:
    return os.path.join(root, sha[:2], sha)


def verify(src: str) -> dict[str, Any]:
    """Check a backup: manifest present, database hash and `quick_check`, a schema this
    coordd knows (not a newer one's), every artifact's hash. Returns the manifest.

    Raises:
        RestoreRefused: anything is missing or does not match, or the schema is newer.
    """
    src = os.path.abspath(src)
    try:
        with open(src + MANIFEST_SUFFIX) as f:
            manifest = json.load(f)
        db_sha, _ = cas.sha256_file(src)
    except (OSError, ValueError) as exc:
        raise RestoreRefused(f"{src}: no readable backup with a manifest: {exc}") from exc
    if db_sha != manifest["db"]["sha256"]:
        raise RestoreRefused(f"{src}: database does not match its manifest's sha256")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{src}?mode=ro", uri=True)) as conn:
            qc, fk = views.integrity(conn)
            version = conn.execute(reads.SQL_USER_VERSION).fetchone()[0]
    except sqlite3.Error as exc:
        raise RestoreRefused(f"{src}: not a readable SQLite database: {exc}") from exc
    if version > SCHEMA_VERSION:  # this coordd would refuse to start on it
        raise RestoreRefused(f"{src}: {errors.schema_too_new(version, SCHEMA_VERSION)}")
    if qc != "ok" or fk:
        raise RestoreRefused(f"{src}: quick_check {qc!r}, {len(fk)} foreign-key violation(s)")
    for art in manifest["artifacts"]:
        path = _in_store(src + ARTIFACTS_SUFFIX, art["sha256"])
        try:
            sha, size = cas.sha256_file(path)
        except OSError as exc:
            raise RestoreRefused(f"artifact {art['sha256']}: {exc.strerror or exc}") from exc
        if sha != art["sha256"] or size != art["bytes"]:
            raise RestoreRefused(f"artifact {art['sha256']}: content does not match its hash")
    return manifest


def restore(src: str, db_path: str, artifact_dir: str,
            now: float | None = None) -> dict[str, Any]:
    """Verify the backup at `src`, then install it as `db_path` (coordd must be stopped).
    A database already at `db_path` is kept beside it (`_keep_replaced`; `now` names it,
    default the system clock).

    Returns `{"db", "jobs", "artifacts", "missing", "replaced"}` ("replaced": where the
    old database was kept, or None).
    Raises:
        RestoreRefused: the backup does not verify, or the database's folder does not
            exist (nothing was changed).
        errors.InvalidState: coordd (or another restore) holds the database's lock.
    """
    src = os.path.abspath(src)
    now = SystemClock().wall() if now is None else now
    folder = os.path.dirname(os.path.abspath(db_path))
    if not os.path.isdir(folder):
        raise RestoreRefused(f"restore: the database's folder {folder} does not exist (create "
                             f"it, owned by coordd's user, or give --db another path); "
                             f"nothing was changed")
    with db_lock(db_path) as db_path:  # a symlink's target is replaced, not the link
        manifest = verify(src)
        for art in manifest["artifacts"]:  # files first, then the records that name them
            sha = art["sha256"]
            if not _copy_verified(_in_store(src + ARTIFACTS_SUFFIX, sha), artifact_dir, sha):
                raise RestoreRefused(f"artifact {sha}: could not be installed in {artifact_dir}")
        tmp = f"{db_path}.restore-{secrets.token_hex(4)}"
        try:
            shutil.copyfile(src, tmp)
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                for art in manifest["artifacts"]:
                    path = _in_store(artifact_dir, art["sha256"])
                    conn.execute(reads.SQL_SET_ARTIFACT_PATH, (path, art["sha256"]))
                for job_id, key, sha, _old in conn.execute(reads.SQL_CHECKPOINT_REFS).fetchall():
                    conn.execute(reads.SQL_SET_CHECKPOINT_PATH,
                                 (key, _in_store(artifact_dir, sha), job_id))
                conn.execute("COMMIT")
                jobs = views.count_jobs(conn)
            finally:
                conn.close()
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            kept = _keep_replaced(db_path, now)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(db_path + "-shm")
            try:
                os.rename(tmp, db_path)
            except OSError:
                if kept is not None and os.path.exists(kept + "-wal"):
                    os.rename(kept + "-wal", db_path + "-wal")  # the old one stays whole
                raise
            cas.fsync_dir(os.path.dirname(db_path))
        except (OSError, sqlite3.Error) as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise errors.CoordError(f"restore failed before the rename, "
                                    f"{db_path} is unchanged: {exc}") from exc
    return {"db": db_path, "jobs": jobs, "artifacts": len(manifest["artifacts"]),
            "missing": manifest["missing"], "replaced": kept}


def _keep_replaced(db_path: str, now: float) -> str | None:
    """Keep the database a restore replaces beside it, as `<db>.replaced-<UTC time>`
    (hard-linked, so the old file is kept whole; its WAL moves along, so what it committed
    last is kept too). Returns that path, or None when there was no database.

    Raises:
        OSError: it could not be kept (then nothing is replaced).
    """
    if not os.path.exists(db_path):
        return None
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    kept = f"{db_path}.replaced-{stamp}"
    n = 1
    while os.path.exists(kept):
        n += 1
        kept = f"{db_path}.replaced-{stamp}-{n}"
    os.link(db_path, kept)
    with contextlib.suppress(FileNotFoundError):
        os.rename(db_path + "-wal", kept + "-wal")
    return kept


def ownership_problem(db_path: str, artifact_dir: str) -> str | None:
    """After a restore run as root into a folder another user owns (coordd's, under
    systemd): the files root now owns there, which coordd (as that user) cannot open, and
    the `chown` that fixes them; None otherwise."""
    if os.geteuid() != 0:
        return None
    folder = os.path.dirname(os.path.abspath(db_path))
    st = os.stat(folder)
    if st.st_uid == 0:
        return None
    mine = [p for p in (db_path, db_path + ".lock") if _root_owned(p)]
    if _root_owned(artifact_dir) or any(_root_owned(os.path.join(d, n))
                                        for d, subs, files in os.walk(artifact_dir)
                                        for n in subs + files):
        mine.append(artifact_dir)
    if not mine:
        return None
    owner, group = _name(pwd.getpwuid, st.st_uid), _name(grp.getgrgid, st.st_gid)
    return (f"restored as root: {', '.join(mine)} now belong to root, but {folder} belongs to "
            f"{owner}: coordd running as {owner} cannot open them. Before starting coordd, "
            f"run: chown -R {owner}:{group} {' '.join(mine)}  (or restore as that user: "
            f"sudo -u {owner} coordctl restore ...)")


def _root_owned(path: str) -> bool:
    try:
        return os.lstat(path).st_uid == 0
    except OSError:
        return False


def _name(lookup: Any, ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)
