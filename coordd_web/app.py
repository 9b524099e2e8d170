"""The web view's Starlette app: pages rendered on the server from coordd's read methods.

Stateless: every request opens its own connection to coordd's socket (coordd.client) and
keeps nothing after it answers, so a coordd restart loses nothing here and a slow browser
holds only its own connection. Actions exist only when `actions` is on (coordd_web.
actions); live updates come from coordd's event feed (coordd_web.live).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from coordctl import render
from coordd import errors
from coordd.client import Client
from coordd.wire.protocol import TERMINAL_STATUSES
from coordd_web import failures, live, shapes
from coordd_web.filters import FILTERS, RETRYABLE, job_filters  # noqa: F401 (app names them)
from coordd_web.peer import tcp_peer_uid
from coordd_web.security import (
    HostGuard, PeerGuard, PeerLookup, cookie_args, session_token, token_ok,
)

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
CALL_TIMEOUT_S = 10.0  # one call to coordd
PAGE_DEADLINE_S = 15.0  # every call of one page together
JOBS_PAGE = 50
RECENT_JOBS = 15
LOG_BYTES_SHOWN = 64 << 10  # a job page shows this much of the captured output


@dataclass
class Settings:
    """How one coordd-web process runs: coordd's socket, whether actions are on, the
    per-start token (None with actions off), extra allowed Host names, and how a
    request's peer uid is found (security.PeerGuard)."""

    socket: str | None
    actions: bool = False
    token: str | None = None
    allow_hosts: tuple[str, ...] = ()
    peer_uid: PeerLookup = tcp_peer_uid


templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters.update(time=shapes.fmt_time, age=shapes.fmt_age, blob=shapes.fmt_blob,
                             gates=shapes.gate_words, item=shapes.summary_item)
templates.env.globals.update(terminal=TERMINAL_STATUSES, retryable=RETRYABLE)
templates.env.filters.update(request=render.job_resources)  # as `coordctl show` says it
templates.env.globals.update(error_explains=render.ERROR_EXPLAINS)


@contextlib.asynccontextmanager
async def coordd(request: Request) -> AsyncIterator[Client]:
    """A connection to coordd for this request only, for at most PAGE_DEADLINE_S; coordd's
    errors become HTTP answers (coordd_web.failures: 504 timeout, 503 unreachable or
    overloaded, 403 refused, 404, 400, 502 for the rest)."""
    settings: Settings = request.app.state.settings
    client = Client(settings.socket, timeout=CALL_TIMEOUT_S)
    try:
        async with asyncio.timeout(PAGE_DEADLINE_S):
            yield client
    except TimeoutError as exc:
        logger.warning("%s: no page within %gs", request.url.path, PAGE_DEADLINE_S,
                       extra={"action": "web_coordd_error", "code": "timeout"})
        raise HTTPException(504, f"coordd did not answer within {PAGE_DEADLINE_S:g}s") \
            from exc
    except errors.CoordError as exc:
        status = failures.status_of(exc)
        if status >= 500:
            logger.warning("%s: %s: %s", request.url.path, exc.code, exc,
                           extra={"action": "web_coordd_error", "code": exc.code})
        raise HTTPException(status, failures.words_of(exc)) from exc
    finally:
        await client.close()


def render(request: Request, name: str, status_code: int = 200, **ctx: Any) -> Response:
    """A page from templates/ with what every page needs (nav, token, live feed)."""
    settings: Settings = request.app.state.settings
    ctx.setdefault("feed", "/events")
    return templates.TemplateResponse(request, name, {
        "actions": settings.actions, "token": session_token(request, settings.token),
        "path": request.url.path, **ctx}, status_code=status_code)


async def overview(request: Request) -> Response:
    """GET /: counts, rates, warnings, the newest jobs."""
    async with coordd(request) as c:
        st = await c.status()
        stats = await c.call("job_stats", {"window_s": 3600, "bucket_s": 60})
        recent = await c.call("find_jobs", {"limit": RECENT_JOBS})
    rates = {"t": stats["bucket_starts"], "ok": stats["succeeded"], "bad": stats["failed"],
             "skip": stats.get("skipped", []), "gone": stats.get("cancelled", [])}
    return render(request, "overview.html", st=st, stats=stats, recent=recent["jobs"],
                  rates=rates, head=stats["head_event_id"], now=st.now)


async def workers_page(request: Request) -> Response:
    """GET /workers: readings sparklines, verdicts, held jobs, reservations."""
    async with coordd(request) as c:
        res = await c.workers()
        fleet = await c.call("fleet", {})
    held: dict[str, list[dict[str, Any]]] = {}
    for lease in fleet["held"]:
        held.setdefault(lease["worker_id"], []).append(lease)
    reserved: dict[str, list[dict[str, Any]]] = {}
    for r in fleet["reservations"]:
        reserved.setdefault(r["worker_id"], []).append(r)
    rows = [{"w": w, "sparks": shapes.sparklines(fleet["readings"].get(w.worker_id, [])),
             "held": held.get(w.worker_id, []), "reserved": reserved.get(w.worker_id, []),
             "resources": shapes.resource_words(w), "verdicts": shapes.verdict_cells(w.verdicts)}
            for w in res.workers]
    return render(request, "workers.html", rows=rows, now=fleet["now"],
                  head=fleet["head_event_id"])


async def jobs_page(request: Request) -> Response:
    """GET /jobs?FILTERS[&before=JOB[&trail=JOB,...]]: one keyset page of jobs."""
    filters = job_filters(request)
    before = request.query_params.get("before") or None
    async with coordd(request) as c:
        page = await c.call("find_jobs", {**filters, "limit": JOBS_PAGE, "before": before})
        head = (await c.call("feed_head", {}))["event_id"]
        now = (await c.status()).now  # coordd's clock: a lease's time left
    shown = {k: request.query_params.get(k, "") for k in FILTERS}
    links = shapes.pager(shown, before, request.query_params.get("trail"), page["next_before"])
    return render(request, "jobs.html", page=page, f=shown, first=before is None, **links,
                  query=urlencode({k: v for k, v in shown.items() if v}), head=head, now=now,
                  statuses=("waiting", "running", "succeeded", "failed", "cancelled",
                            "blocked", "skipped"))


async def job_page(request: Request) -> Response:
    """GET /jobs/ID (or an id prefix): the job, its attempts, why it waits."""
    async with coordd(request) as c:
        job = await c.get_job(request.path_params["job_id"], prefix=True)
        now = (await c.status()).now
        head = (await c.call("feed_head", {}))["event_id"]
        try:
            logs = await c.job_logs(job.job_id, limit_bytes=LOG_BYTES_SHOWN)
        except errors.UnknownMethod:  # an older coordd keeps no output
            logs = None
    tries = shapes.attempts(job)
    return render(request, "job.html", job=job, attempts=tries, now=now, head=head,
                  output=shapes.output(logs.chunks) if logs else [],
                  output_more=bool(logs and logs.more),
                  bars=shapes.timeline_bars(tries, job, now),
                  feed=f"/events?{urlencode({'job': job.job_id})}")


async def workflows_page(request: Request) -> Response:
    """GET /workflows: the newest workflows."""
    async with coordd(request) as c:
        flows = await c.workflow_list(limit=100)
        head = (await c.call("feed_head", {}))["event_id"]
    return render(request, "workflows.html", flows=flows.workflows, head=head)


async def workflow_page(request: Request) -> Response:
    """GET /workflows/ID: graph, summary, nodes, Gantt of node runs."""
    wf_id = request.path_params["workflow_id"]
    async with coordd(request) as c:
        wf = await c.workflow_get(wf_id)
        runs = await c.call("workflow_runs", {"workflow_id": wf_id})
        now = (await c.status()).now
        head = (await c.call("feed_head", {}))["event_id"]
    graph = {"nodes": [{"id": n.name, "status": n.status, "kind": n.kind,
                        "href": f"/jobs/{n.job_id}"} for n in wf.nodes],
             "edges": [{"from": e.node, "to": n.name, "policy": e.policy}
                       for n in wf.nodes for e in n.needs]}

    class Run:  # attribute access for shapes.gantt
        def __init__(self, d: dict[str, Any]) -> None:
            self.__dict__.update(d)
    return render(request, "workflow.html", wf=wf, graph=graph, now=now, head=head,
                  gantt=shapes.gantt([Run(r) for r in runs["runs"]], now),
                  feed=f"/events?{urlencode({'workflow': wf_id})}")


async def agents_page(request: Request) -> Response:
    """GET /agents[?before=MSG]: agents, messages with their deliveries."""
    async with coordd(request) as c:
        agents = await c.get_agent_status(limit=200)
        log = await c.call("message_log", {"limit": 50,
                                           "before": request.query_params.get("before")})
        now = (await c.status()).now
        head = (await c.call("feed_head", {}))["event_id"]
    return render(request, "agents.html", agents=agents.agents, log=log, now=now, head=head)


async def robots(request: Request) -> Response:
    """GET /robots.txt: keep crawlers out."""
    return Response("User-agent: *\nDisallow: /\n", media_type="text/plain")


async def favicon(request: Request) -> Response:
    """GET /favicon.ico: none (204)."""
    return Response(status_code=204)


async def take_token(request: Request) -> Response | None:
    """`?token=` on any page: set the cookie and redirect to the same URL without it."""
    settings: Settings = request.app.state.settings
    given = request.query_params.get("token")
    if given is None:
        return None
    if not token_ok(given, settings.token):
        raise HTTPException(403, "wrong token")
    rest = {k: v for k, v in request.query_params.items() if k != "token"}
    resp = RedirectResponse(request.url.path + ("?" + urlencode(rest) if rest else ""), 303)
    resp.set_cookie(**cookie_args(settings.token))
    return resp


def with_token(handler: Any) -> Any:
    """`handler`, after `take_token`."""
    async def wrapped(request: Request) -> Response:
        return await take_token(request) or await handler(request)
    return wrapped


async def http_error(request: Request, exc: Exception) -> Response:
    """An HTTPException as an error page (plain text under /static)."""
    assert isinstance(exc, HTTPException)
    if request.url.path.startswith("/static/"):
        return Response(exc.detail, exc.status_code, media_type="text/plain")
    return render(request, "error.html", status_code=exc.status_code, code=exc.status_code,
                  detail=exc.detail, head=0, feed="")


def build_app(settings: Settings, feed: live.Feed | None = None) -> Any:
    """The ASGI app for `settings` (wrapped in the peer uid check, the Host allowlist and
    the security headers); its live streams follow `feed` (default: a new one), which
    ends them when closed."""
    routes = [
        Route("/", with_token(overview)),
        Route("/workers", with_token(workers_page)),
        Route("/jobs", with_token(jobs_page)),
        Route("/jobs/{job_id}", with_token(job_page)),
        Route("/workflows", with_token(workflows_page)),
        Route("/workflows/{workflow_id}", with_token(workflow_page)),
        Route("/agents", with_token(agents_page)),
        Route("/events", live.events),
        Route("/robots.txt", robots),
        Route("/favicon.ico", favicon),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if settings.actions:
        from coordd_web import actions
        routes += actions.ROUTES
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.settings = settings
    app.state.feed = feed or live.Feed(settings.socket)
    return HostGuard(PeerGuard(app, settings.peer_uid), settings.allow_hosts)
