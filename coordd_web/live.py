"""Live updates: Server-Sent Events driven by coordd's event feed (`watch_events`).

One stream per browser tab, one coordd connection per stream, nothing kept here: the
cursor is the browser's (`after`, or `Last-Event-ID` when it reconnects), so a resumed
stream misses nothing. Each SSE message sums one feed reply (how many events, the newest
id, a few job ids), and a stream asks coordd at most every PACE_S: however busy coordd is,
a tab costs it a couple of reads a second. The page re-renders its live parts on a
message; no page polls.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from coordd import errors
from coordd.client import CallTimeout, Client, Disconnected

logger = logging.getLogger(__name__)

WAIT_S = 15.0        # a feed call parks this long at most (then a keep-alive comment)
PACE_S = 0.5         # the least time between two feed calls of one stream
RETRY_MS = 2000      # the browser's reconnect delay
DOWN_RETRY_S = 2.0   # coordd unreachable: try again after this
IDS_SHOWN = 20


def _cursor(request: Request) -> int:
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    try:
        return max(0, int(raw))
    except ValueError:
        return 0


def _message(event: str, data: Any, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def stream(socket: str | None, after: int, flt: dict[str, Any]) -> AsyncIterator[bytes]:
    """SSE frames from coordd's feed after `after` (matching `flt`), forever."""
    yield f"retry: {RETRY_MS}\n\n".encode()
    client = Client(socket, timeout=WAIT_S + 10)
    up = None
    try:
        while True:
            try:  # the first look answers at once, so the page knows coordd is up
                res = await client.watch_events(after=after, wait_s=WAIT_S if up else 0.0,
                                                limit=1000, filter=flt)
            except (Disconnected, CallTimeout, errors.Overloaded) as exc:
                if up is not False:
                    yield _message("coordd", {"up": False, "why": str(exc)})
                up = False
                await asyncio.sleep(DOWN_RETRY_S)
                continue
            if up is not True:
                yield _message("coordd", {"up": True})
                up = True
            after = res.next_after
            if res.events:
                statuses: dict[str, int] = {}
                for ev in res.events:
                    statuses[ev.to_status] = statuses.get(ev.to_status, 0) + 1
                yield _message("jobs", {"n": len(res.events), "statuses": statuses,
                                        "jobs": [e.job_id for e in res.events[-IDS_SHOWN:]]},
                               after)
            else:
                yield b": keep-alive\n\n"
            await asyncio.sleep(PACE_S)
    finally:
        await client.close()


async def events(request: Request) -> Response:
    """GET /events[?after=N][&job=ID][&workflow=ID]: the SSE stream."""
    flt: dict[str, Any] = {}
    if request.query_params.get("job"):
        flt["job_id"] = request.query_params["job"]
    if request.query_params.get("workflow"):
        flt["workflow_id"] = request.query_params["workflow"]
    settings = request.app.state.settings
    return StreamingResponse(stream(settings.socket, _cursor(request), flt),
                             media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})
