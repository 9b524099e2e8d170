"""The seam: the areas the store interface (coordd.store.api) does not cover yet.

`AREAS` names them and their RPC methods. A store says which it serves in `store.areas`
(SQLiteStore: all of them; PostgresStore: none yet). `serve` binds each area's methods
on the Coordinator: on a store that offers the area, to the code below; otherwise to a
refusal, `unknown_method` ("METHOD: not available on the <store> store yet", or the
store's own word in `store.refusals`), which clients read as "this coordd does not serve
it" and fall back.

This module is the only place the coordinator reaches a store's internals: `SQLiteSide`
hands the SQLite store's writer, read pool and files to the modules that serve these
areas today (coordd.web_reads, coordd.waits). Moving an area onto
the interface: give both stores its operations, serve its methods from the Coordinator
over `self.store`, and drop its entry here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coordd import errors, views
from coordd.protocol import Heartbeat, HeartbeatResult
from coordd.protocol_push import PUSH_PARAMS
from coordd.protocol_web import WEB_PARAMS
from coordd.store.api import JobFilter
from coordd.waits import Waits
from coordd.web_reads import WebReads

if TYPE_CHECKING:
    from coordd.service.coordinator import Coordinator

AREAS: dict[str, tuple[str, ...]] = {
    "web": tuple(WEB_PARAMS),  # find_jobs, job_stats, fleet, feed_head, workflow_runs, ...
    "waits": tuple(PUSH_PARAMS),  # wait_job, watch_worker, watch_events
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
    SQLite store's read pool."""

    def __init__(self, coord: Coordinator) -> None:
        self._coord = coord
        self.readers = coord.store.readers

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coord, name)

    async def read(self, fn: Any, *args: Any) -> Any:
        """Run `fn(conn, *args)` on a read-only connection. Raises: errors.Overloaded."""
        return await self.readers.run(fn, *args)


class SQLiteLocal:
    """The AREAS methods on a SQLite store (see the module docstring)."""

    def __init__(self, coord: Coordinator) -> None:
        side = self.side = SQLiteSide(coord)
        self._coord = coord
        self.web = WebReads(side.read, coord.clock.wall)
        self.web._explain, self.web._aging_s = coord.explain_waiting, \
            coord.config.aging_interval_s
        self.waits = Waits(coord.push, side.read, coord.get_job)
        for method in WEB_PARAMS:
            setattr(self, method, getattr(self.web, method))
        for method in PUSH_PARAMS:
            setattr(self, method, getattr(self.waits, method))

    def heard(self, p: Heartbeat, res: HeartbeatResult) -> None:
        """After a heartbeat committed: its readings go to the web view's history."""
        self.web.readings.add(p.worker_id, res.now, p.readings)

    async def job_bytes(self, job_id: str) -> int:
        """What a job's view will carry, before it is read (coordd.budgets)."""
        return await self.side.read(views.job_bytes, job_id)  # type: ignore[no-any-return]

    async def page_bytes(self, flt: JobFilter) -> int:
        """What a `list_jobs` page will carry, before it is read (coordd.budgets)."""
        return await self.side.readers.run(  # type: ignore[no-any-return]
            lambda conn: views.page_bytes(
                conn, status=flt.status, kind=flt.kind, role=flt.role, priority=flt.priority,
                limit=flt.limit, after=flt.after, newest_first=flt.newest_first), heavy=True)
