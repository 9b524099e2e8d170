"""The SQLite store's wake-ups of parked calls (coordd.service.push, the coordinator's
`StoreHooks.push`): everything of them that touches the writer's connection.

The rule not to break: a wake-up is issued only after the COMMIT that makes its change
visible. Inside the writer's transaction the job hook (coordd.store.sqlite.job_changes:
`job_waiting`, `job_ended`) and the TEMP triggers (coordd.store.push: `note`) note what
may wake a parked call; after the COMMIT the writer calls `push.committed()` (or
`rolled_back()`), and Push asks `events_moved()` whether new job events committed (the
highest event id says). The heartbeat and freed-limit triggers note only while a claim is
parked (`claims_parked`: a row in a TEMP table). The run_at timer reads the waiting jobs
not yet due from the writer's connection at open and after a wall-clock step.

The TEMP tables and their statements run on the writer's connection from the event loop,
never inside its transaction (a batch runs without yielding to the loop).
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from coordd.store import push as push_store

logger = logging.getLogger(__name__)


class SQLiteWakeups:
    """Mixed into SQLiteStore (its `writer`): `attach_wakeups(push)` hooks a Push to the
    writer; `claims_parked` is the store interface's (coordd.store.api_waits)."""

    writer: Any
    _wake_conn: sqlite3.Connection | None = None  # the writer's connection, once open
    _last_event = 0
    _push: Any = None

    def attach_wakeups(self, push: Any) -> None:
        """Let the writer note its changes to `push` and wake it after each COMMIT (the
        store's own commit hook calls `push.committed()`)."""
        self._push = push
        self.writer.on_open = self._open_wakeups
        self.writer.changes.listener = push  # jobs entering waiting or ending
        self.writer.on_rollback = push.rolled_back
        self.writer.on_clock_step = push.clock_stepped

    def _open_wakeups(self, conn: sqlite3.Connection) -> None:
        """The writer's `on_open`: install the TEMP triggers on its connection and start
        Push's run_at timer with the jobs already scheduled there."""
        push_store.install(conn, self._push.note)
        self._wake_conn = conn
        self._last_event = push_store.last_event(conn)
        self._push.start(self._scheduled_due, self._events_moved)

    def _scheduled_due(self, now: float) -> list[tuple[float, str, str]]:
        """(run_at, role, kind) of the waiting jobs not yet due at `now`, on the writer's
        connection (so none committed before it is missed)."""
        return push_store.scheduled(self._wake_conn, now)  # type: ignore[arg-type]

    def _events_moved(self) -> bool:
        """Whether job events were committed since the last time it was asked."""
        last = push_store.last_event(self._wake_conn)  # type: ignore[arg-type]
        if last == self._last_event:
            return False
        self._last_event = last
        return True

    def claims_parked(self, on: bool) -> None:
        """Tell the heartbeat and freed-limit triggers whether a claim is parked (they
        note rows only then). Nothing before the writer is open; never raises."""
        if self._wake_conn is None:
            return
        try:
            push_store.claims_parked(self._wake_conn, on)
        except sqlite3.Error as exc:  # closed at shutdown: nothing is parked any more
            logger.debug("push flag: %s", exc)


__all__ = ["SQLiteWakeups"]
