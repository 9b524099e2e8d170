"""The write actions (cancel, retry, retry every matching job, reap): mounted only when
coordd-web runs with `--actions`. Each request must pass coordd_web.security's checks
(same origin, the token header and cookie); coordd then applies its own admin check to
this process's uid, and its refusal is shown as it is.
"""

from __future__ import annotations

import html
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from coordd import errors
from coordd.client import Client
from coordd_web import failures
from coordd_web.filters import RETRYABLE, job_filters
from coordd_web.security import action_refusal

logger = logging.getLogger(__name__)

RETRY_MATCHING_MAX = 1000  # jobs one retry-all-matching retries at most
CALL_TIMEOUT_S = 10.0


def _answer(text: str, status: int = 200) -> Response:
    return HTMLResponse(f'<p class="flash {"ok" if status == 200 else "bad"}" '
                        f'role="status">{html.escape(text)}</p>', status)


async def _run(request: Request, what: str, call: Any) -> Response:
    settings = request.app.state.settings
    why = action_refusal(request, settings.token)
    if why is not None:
        logger.warning("refused %s: %s", what, why, extra={"action": "web_refused"})
        return _answer(why, 403)
    client = Client(settings.socket, timeout=CALL_TIMEOUT_S)
    try:
        text = await call(client)
    except (errors.NotFound, errors.InvalidState, errors.BadRequest) as exc:
        return _answer(f"{what}: {exc.code}: {exc}", 409)
    except errors.CoordError as exc:  # timeout 504, unreachable 503, refused 403, else 502
        status = failures.status_of(exc)
        logger.warning("%s: %s: %s", what, exc.code, exc,
                       extra={"action": "web_coordd_error", "code": exc.code})
        return _answer(f"{what}: {failures.words_of(exc)}", status)
    finally:
        await client.close()
    logger.info("%s: %s", what, text, extra={"action": "web_action"})
    return _answer(text)


async def cancel(request: Request) -> Response:
    """POST /actions/cancel/ID."""
    job_id = request.path_params["job_id"]

    async def call(c: Client) -> str:
        status = (await c.cancel(job_id)).status
        if status == "running":  # as `coordctl cancel`: the holder stops it, then cancelled
            return (f"job {job_id}: cancel requested; its worker is told at once and stops "
                    "it, then it is cancelled")
        return f"job {job_id}: {status}"
    return await _run(request, "cancel", call)


async def retry(request: Request) -> Response:
    """POST /actions/retry/ID."""
    job_id = request.path_params["job_id"]

    async def call(c: Client) -> str:
        return f"job {job_id}: {(await c.retry(job_id)).status}"
    return await _run(request, "retry", call)


async def reap(request: Request) -> Response:
    """POST /actions/reap."""
    async def call(c: Client) -> str:
        return f"reaped {(await c.reap()).reaped} expired lease(s)"
    return await _run(request, "reap", call)


async def retry_matching(request: Request) -> Response:
    """POST /actions/retry-matching?FILTERS: retry up to RETRY_MATCHING_MAX matching jobs."""
    filters = job_filters(request)
    if filters.get("status") not in RETRYABLE:
        return _answer("retry-all-matching needs a status filter: failed, cancelled or "
                       "skipped", 400)

    async def call(c: Client) -> str:
        done, before, refused = 0, None, 0
        while done + refused < RETRY_MATCHING_MAX:
            page = await c.call("find_jobs", {**filters, "limit": 200, "before": before,
                                              "scan": 200000})
            for job in page["jobs"][:RETRY_MATCHING_MAX - done - refused]:
                try:
                    await c.retry(job["job_id"])
                    done += 1
                except errors.InvalidState:
                    refused += 1
            before = page["next_before"]
            if before is None:
                break
        return f"retried {done} job(s)" + (f", {refused} no longer retryable" if refused else "")
    return await _run(request, "retry-all-matching", call)


ROUTES = [
    Route("/actions/cancel/{job_id}", cancel, methods=["POST"]),
    Route("/actions/retry/{job_id}", retry, methods=["POST"]),
    Route("/actions/retry-matching", retry_matching, methods=["POST"]),
    Route("/actions/reap", reap, methods=["POST"]),
]
"""Every action endpoint (absent unless actions are on)."""
