"""The seam: the areas the store interface (coordd.store.api) does not cover yet.

`AREAS` names them and their RPC methods. A store says which it serves in `store.areas`
(SQLiteStore: all of them; PostgresStore: none yet). `serve` binds each area's methods
on the Coordinator: on a store that offers the area, to the code below; otherwise to a
refusal, `unknown_method` ("METHOD: not available on the <store> store yet", or the
store's own word in `store.refusals`), which clients read as "this coordd does not serve
it" and fall back.

This module is the only place the coordinator reaches a store's internals: `SQLiteSide`
hands the SQLite store's writer, read pool and files to the modules that serve these
areas today (coordd.transfers, coordd.maintenance, coordd.backup, coordd.workflows'
schedules and maintenance round). Moving an area onto
the interface: give both stores its operations, serve its methods from the Coordinator
over `self.store`, and drop its entry here.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from coordd import backup, cas, errors, views
from coordd.config import artifact_dir_for
from coordd.maintenance import Maintenance
from coordd.metrics import tree_bytes
from coordd.protocol import Backup, BackupResult, Empty, Heartbeat, HeartbeatResult
from coordd.transfers import TRANSFER_METHODS, Transfers
from coordd.workflows import Workflows

if TYPE_CHECKING:
    from coordd.service.coordinator import Coordinator

AREAS: dict[str, tuple[str, ...]] = {
    "artifacts": TRANSFER_METHODS,  # artifact_put, artifact_get (and `complete`'s artifact)
    "maintenance": ("check", "prune", "backup"),
    "schedules": ("schedule_add", "schedule_list", "schedule_remove"),
}
"""Area -> its RPC methods, served here on a store whose `areas` names the area."""
BEYOND_INTERFACE = frozenset(m for methods in AREAS.values() for m in methods)
"""Every method of AREAS: what a store that offers no area (PostgreSQL today) refuses."""


def serve(coord: Coordinator) -> SQLiteLocal | None:
    """Bind every AREAS method on `coord`: served (SQLiteLocal) where `coord.store`
    offers the area, refused otherwise. Returns the SQLiteLocal, or None where the store
    offers no area."""
    offered = coord.store.areas
    part = SQLiteLocal(coord) if offered else None
    for area, methods in AREAS.items():
        for method in methods:
            setattr(coord, method, getattr(part, method) if area in offered and part
                    else _refusal(method, coord.store))
    return part


def _refusal(method: str, store: Any) -> Any:
    note = store.refusals.get(method) or \
        f"{method}: not available on the {store.name} store yet"

    async def refuse(p: Any = None) -> Any:
        raise errors.UnknownMethod(note)
    return refuse


class SQLiteSide:
    """The Coordinator as the modules of these areas see it: its own attributes, and the
    SQLite store's writer, read pool, database file and artifact folder."""

    def __init__(self, coord: Coordinator) -> None:
        store = coord.store
        self._coord = coord
        self.writer = store.writer
        self.readers = store.readers
        self.db_path: str = store.path
        self.artifact_dir = artifact_dir_for(store.path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coord, name)

    @property
    def artifact_bytes(self) -> int:
        return self._coord.artifact_bytes

    @artifact_bytes.setter
    def artifact_bytes(self, value: int) -> None:
        self._coord.artifact_bytes = value

    async def read(self, fn: Any, *args: Any) -> Any:
        """Run `fn(conn, *args)` on a read-only connection. Raises: errors.Overloaded."""
        return await self.readers.run(fn, *args)


class SQLiteLocal:
    """The AREAS methods on a SQLite store (see the module docstring)."""

    def __init__(self, coord: Coordinator) -> None:
        side = self.side = SQLiteSide(coord)
        self._coord = coord
        self.artifact_dir = side.artifact_dir
        self.flows = Workflows(side)  # schedules and the maintenance round
        self.maintenance = Maintenance(side)
        self.transfers = Transfers(side.artifact_dir, side.read, coord.clock, coord.config)
        for method in TRANSFER_METHODS:
            setattr(self, method, getattr(self.transfers, method))
        self.schedule_add = self.flows.schedule_add
        self.schedule_list = self.flows.schedule_list
        self.schedule_remove = self.flows.schedule_remove
        self.prune = self.maintenance.prune

    async def start(self) -> None:
        """The artifact folder, made where it is missing (setgid, group-writable: workers
        of group coordd write into it too)."""
        with contextlib.suppress(OSError):
            cas.make_dir(self.artifact_dir)

    def heard(self, p: Heartbeat, res: HeartbeatResult) -> None:
        """After a heartbeat committed: its reply names the artifact folder."""
        res.artifact_dir = self.artifact_dir

    def artifact_tree_bytes(self) -> int:
        """The artifact folder's size in bytes (blocking: run it in a thread)."""
        return tree_bytes(self.artifact_dir)

    async def check(self, p: Empty | None = None) -> dict[str, Any]:
        """Run `PRAGMA quick_check` and `foreign_key_check` on the live database."""
        qc, fk = await self.side.readers.run(views.integrity, heavy=True)
        return {"quick_check": qc, "foreign_key_violations": len(fk)}

    async def backup(self, p: Backup) -> BackupResult:
        """Write a verified backup at `p.dest`: the database copied with SQLite's backup API
        while writes go on, the artifact files it refers to, and a manifest of their
        sha256 (coordd.backup). Runs in a thread, beside the writer.

        Raises: BadRequest (dest exists or its folder is missing), CoordError (the copy
        failed its check: it is removed).
        """
        return await asyncio.to_thread(backup.backup, self.side.db_path, self.artifact_dir,
                                       p.dest)
