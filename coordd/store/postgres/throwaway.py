"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb, start, stop, remove.

Unix socket only (`listen_addresses=''`), in the cluster's own temporary folder; run as
`nobody` when we are root (the server refuses root), else as ourselves. `fsync=off`
unless asked: the data is thrown away. Binaries come from /usr/lib/postgresql/*/bin or
PATH (shared/FLEET.md B2 has the recipe and its timings).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PORT_DEFAULT = 55432
USER = "coord"
START_TIMEOUT_S = 30


def binaries() -> Path | None:
    """The folder holding initdb and pg_ctl (the newest /usr/lib/postgresql/N/bin first,
    then PATH), or None where PostgreSQL is not installed."""
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
                         reverse=True):
        if os.access(os.path.join(folder, "initdb"), os.X_OK):
            return Path(folder)
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    return None


class Cluster:
    """One temporary cluster; `start()` makes and starts it, `stop()` removes it.

    Args:
        fsync: keep the server's fsync on (benchmarks); off for tests.
        port: the socket's port number (the socket file is in the cluster's own folder,
            so clusters of several test runs do not collide).
    """

    def __init__(self, *, fsync: bool = False, port: int = PORT_DEFAULT) -> None:
        self.fsync = fsync
        self.port = port
        self.root: str | None = None
        self._bin = binaries()
        self._as_nobody = os.geteuid() == 0

    @property
    def dsn(self) -> str:
        """A libpq URI for the `postgres` database over the cluster's Unix socket."""
        return f"postgresql://{USER}@/postgres?host={self.root}&port={self.port}"

    def _run(self, *argv: str) -> None:
        cmd = list(argv)
        if self._as_nobody:
            cmd = ["runuser", "-u", "nobody", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()[-2000:]}")

    def start(self) -> str:
        """Create and start the cluster; return its DSN.

        Raises:
            RuntimeError: no PostgreSQL binaries, or initdb / pg_ctl failed (the message
                carries their output).
        """
        if self._bin is None:
            raise RuntimeError("PostgreSQL binaries not found (/usr/lib/postgresql/*/bin, PATH)")
        self.root = tempfile.mkdtemp(prefix="coordd-pg-")
        if self._as_nobody:
            shutil.chown(self.root, "nobody", "nogroup")
        os.chmod(self.root, 0o700)
        data = os.path.join(self.root, "data")
        self._run(str(self._bin / "initdb"), "-D", data, "-U", USER, "--auth=trust",
                  "-E", "UTF8", "--locale=C.UTF-8", "-N")
        opts = [f"-k {self.root}", "-c listen_addresses=''", f"-p {self.port}",
                "-c max_connections=200"]
        if not self.fsync:
            opts += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._run(str(self._bin / "pg_ctl"), "-D", data, "-l",
                  os.path.join(self.root, "server.log"), "-w", "-t", str(START_TIMEOUT_S),
                  "-o", " ".join(opts), "start")
        return self.dsn

    def stop(self) -> None:
        """Stop the server (fast) and remove its folder. Idempotent."""
        if self.root is None:
            return
        root, self.root = self.root, None
        try:
            if os.path.exists(os.path.join(root, "data", "postmaster.pid")):
                self._run(str(self._bin / "pg_ctl"), "-D", os.path.join(root, "data"),
                          "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(root, ignore_errors=True)
