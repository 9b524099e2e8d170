"""Live updates: Server-Sent Events driven by coordd's event feed (`watch_events`).

Every stream reads the process's one shared follower (coordd_web.feed), so a tab costs
coordd no parked call; the cursor is the browser's (`after`, or `Last-Event-ID` when it
reconnects), so a resumed stream misses nothing. Each SSE message sums one or more feed
replies (how many events, the newest id, a few job ids); a cursor coordd does not know
(past the head: another database) starts again at the head. The page re-renders its
live parts on a message; no page polls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from coordd import errors
from coordd.client import Client
from coordd.wire.push import FeedEvent
from coordd.wire.push import FEED_CURSOR_MAX
from coordd_web.feed import DOWN_CODES, DOWN_RETRY_S, FEED_LIMIT, PACE_S, Feed

logger = logging.getLogger(__name__)

KEEPALIVE_S = 15.0   # a comment this often while nothing happens
RETRY_MS = 2000      # the browser's reconnect delay
CALL_TIMEOUT_S = 10.0
IDS_SHOWN = 20
STREAMS_MAX = 256    # open streams per coordd-web process (503 past it)


def _cursor(request: Request) -> int:
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    try:
        return min(max(0, int(raw)), FEED_CURSOR_MAX)
    except ValueError:
        return 0


def _message(event: str, data: Any, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _jobs(events: list[FeedEvent], cursor: int) -> bytes:
    statuses: dict[str, int] = {}
    for ev in events:
        statuses[ev.to_status] = statuses.get(ev.to_status, 0) + 1
    return _message("jobs", {"n": len(events), "statuses": statuses,
                             "jobs": [e.job_id for e in events[-IDS_SHOWN:]]}, cursor)


async def _catch_up(socket: str | None, after: int, flt: dict[str, Any]
                    ) -> tuple[list[FeedEvent], int]:
    """One one-shot feed call (never parked) from the stream's own cursor: (events,
    next cursor). A cursor coordd refuses or does not know restarts at the head."""
    async with Client(socket, timeout=CALL_TIMEOUT_S) as c:
        try:
            res = await c.watch_events(after=after, wait_s=0.0, limit=FEED_LIMIT, filter=flt)
        except errors.BadRequest:
            return [], (await c.call("feed_head", {}))["event_id"]
    return res.events, res.next_after


async def stream(feed: Feed, socket: str | None, after: int, flt: dict[str, Any]
                 ) -> AsyncIterator[bytes]:
    """SSE frames from coordd's feed after `after` (matching `flt`), until the feed
    closes (the server is shutting down)."""
    yield f"retry: {RETRY_MS}\n\n".encode()
    async with feed.subscribe():
        up: bool | None = None
        checked = False  # the stream's cursor looked at by coordd once
        epoch = feed.epoch
        while not feed.closing:
            seen = feed.seq
            if feed.epoch != epoch and feed.cursor is not None:  # another database
                epoch, after = feed.epoch, feed.cursor
                yield _jobs([], after)
            events = None if not checked else feed.since(after, flt)
            if events is None:  # behind what the follower keeps: on its own, paced
                try:
                    events, nxt = await _catch_up(socket, after, flt)
                except errors.CoordError as exc:
                    if exc.code not in DOWN_CODES:
                        logger.warning("live stream: %s: %s", exc.code, exc,
                                       extra={"action": "web_feed_error"})
                    if up is not False:
                        yield _message("coordd", {"up": False, "why": str(exc)})
                    up = False
                    await feed.rest(DOWN_RETRY_S)
                    continue
                checked = True
                if up is not True:
                    yield _message("coordd", {"up": True})
                    up = True
                reset = nxt < after  # past coordd's head: it gave the head
                after = nxt
                if events or reset:
                    yield _jobs(events, after)
                await feed.rest(PACE_S)
                continue
            if feed.up is not None and feed.up != up:
                yield _message("coordd", {"up": feed.up, **({} if feed.up else
                                                           {"why": feed.why})})
                up = feed.up
            assert feed.cursor is not None
            after = max(after, feed.cursor)
            if events:
                yield _jobs(events, after)
            if not await feed.changed(seen, KEEPALIVE_S) and not feed.closing:
                yield b": keep-alive\n\n"


async def events(request: Request) -> Response:
    """GET /events[?after=N][&job=ID][&workflow=ID]: the SSE stream (503 past
    STREAMS_MAX open streams)."""
    flt: dict[str, Any] = {}
    if request.query_params.get("job"):
        flt["job_id"] = request.query_params["job"]
    if request.query_params.get("workflow"):
        flt["workflow_id"] = request.query_params["workflow"]
    settings = request.app.state.settings
    feed: Feed = request.app.state.feed
    if feed.streams >= STREAMS_MAX:
        logger.warning("refused a live stream: %d open", feed.streams,
                       extra={"action": "web_streams_full"})
        return PlainTextResponse(f"too many live streams ({STREAMS_MAX} open)", 503)
    return StreamingResponse(stream(feed, settings.socket, _cursor(request), flt),
                             media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})
