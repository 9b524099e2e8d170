"""Fixtures that run a real coordd process on a temporary DB (or a fresh PostgreSQL
database on the session's throwaway cluster) and socket."""

from __future__ import annotations

import asyncio
import os
import uuid
import resource
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from coordd import errors

START_TIMEOUT_S = 15.0


@dataclass
class DaemonProc:
    """A coordd process under test: its paths and Popen, with start/stop/kill."""

    db: str
    socket: str
    config: str | None
    log_path: str
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    nofile: tuple[int, int] | None = None  # RLIMIT_NOFILE (soft, hard) coordd starts under
    store: str | None = None  # a PostgreSQL DSN: `--store` instead of `--db`

    def start(self, wait: bool = True) -> subprocess.Popen:
        where = ["--store", self.store] if self.store else ["--db", self.db]
        argv = [sys.executable, "-m", "coordd", *where, "--socket", self.socket]
        if self.config:
            argv += ["--config", self.config]
        log = open(self.log_path, "ab")
        limit = self.nofile
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=log, env={**os.environ, **self.env},
            preexec_fn=None if limit is None else
            lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))
        log.close()
        if wait:
            self.wait_ready()
        return self.proc

    def wait_ready(self) -> None:
        """Until coordd answers a request (the socket is bound, and so accepts, before the
        database is open: requests wait in the backlog until then)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordd exited {self.proc.returncode}: {self.log()}")
            try:  # in a thread: callers may be inside a running event loop
                with ThreadPoolExecutor(1) as pool:
                    pool.submit(_status, self.socket, max(0.5, deadline - time.monotonic())
                                ).result()
                return
            except (OSError, errors.CoordError):
                time.sleep(0.02)
        raise RuntimeError(f"coordd did not come up: {self.log()}")

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")[-4000:]

    async def artifact_bytes(self, sha256: str) -> bytes:
        """An artifact's bytes where coordd keeps them: the file beside a SQLite database,
        the rows of a PostgreSQL store."""
        if self.store is None:
            return (Path(self.db).parent / "artifacts" / sha256[:2] / sha256).read_bytes()
        import asyncpg
        conn = await asyncpg.connect(self.store)
        try:
            rows = await conn.fetch("SELECT data FROM artifact_chunks WHERE sha256 = $1 "
                                    "ORDER BY pos", sha256)
        finally:
            await conn.close()
        return b"".join(r[0] for r in rows)


def _status(sock: str, timeout: float) -> None:
    from coordd.client import SyncClient
    with SyncClient(sock, timeout=timeout) as c:
        c.status()


@pytest.fixture
def daemon_factory(tmp_path):
    """Make DaemonProcs in tmp_path (not started); every one is stopped at teardown."""
    made: list[DaemonProc] = []

    def make(config_text: str | None = None, name: str = "d") -> DaemonProc:
        cfg = None
        if config_text is not None:
            cfg = str(tmp_path / f"{name}.toml")
            Path(cfg).write_text(config_text)
        d = DaemonProc(db=str(tmp_path / f"{name}.db"), socket=str(tmp_path / f"{name}.sock"),
                       config=cfg, log_path=str(tmp_path / f"{name}.log"))
        made.append(d)
        return d

    yield make
    for d in made:
        try:
            d.stop(5)
        except subprocess.TimeoutExpired:
            d.kill()


@pytest.fixture
def daemon(daemon_factory) -> DaemonProc:
    """A started coordd with the default config."""
    d = daemon_factory()
    d.start()
    return d


@pytest.fixture
def pg_databases(pg_dsn: str) -> Any:
    """Factory: the DSN of a fresh, empty database on the session's cluster at each call
    (all dropped after the test)."""
    import asyncpg
    made: list[str] = []

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    def run(sql: str) -> None:  # in a thread: callers may be inside a running event loop
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, admin(sql)).result()

    def make() -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        run(f"CREATE DATABASE {name}")
        made.append(name)
        return pg_dsn.replace("/postgres?", f"/{name}?")
    yield make
    for name in made:
        run(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def pg_db(pg_databases: Any) -> str:
    """A DSN of a fresh, empty database on the session's cluster (dropped after)."""
    return pg_databases()


STORES = ["sqlite", "postgresql"]


@pytest.fixture(params=STORES)
def store_daemon_factory(request: Any, daemon_factory: Any) -> Any:
    """`daemon_factory` over each store in turn: `--db` a temporary file, then `--store` a
    fresh PostgreSQL database for each daemon made (skipped, with the reason, where asyncpg
    or the server binaries are missing). `make.store` says which ("sqlite"/"postgresql").
    The same test runs on both; a restarted DaemonProc keeps its file or database."""
    databases = request.getfixturevalue("pg_databases") if request.param == "postgresql" \
        else None

    def make(config_text: str | None = None, name: str = "d") -> DaemonProc:
        d = daemon_factory(config_text, name=name)
        if databases is not None:
            d.store = databases()
        return d
    make.store = request.param
    return make


@pytest.fixture
def store_daemon(store_daemon_factory: Any) -> DaemonProc:
    """A started coordd with the default config over each store in turn (as
    `store_daemon_factory`)."""
    d = store_daemon_factory(name=store_daemon_factory.store)
    d.start()
    return d
