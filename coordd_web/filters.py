"""The jobs page's filters from a query string (the jobs list and the retry-all action
read them the same way)."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

FILTERS = ("status", "kind", "role", "priority", "worker", "workflow", "q")
RETRYABLE = ("failed", "cancelled", "skipped")  # the statuses retry-all-matching takes


def job_filters(request: Request) -> dict[str, Any]:
    """The jobs filters from the query string (empty ones dropped), as find_jobs params."""
    q = request.query_params
    out: dict[str, Any] = {}
    for name in FILTERS:
        value = q.get(name, "").strip()
        if not value:
            continue
        if name == "priority":
            if value not in ("0", "1", "2", "3"):
                raise HTTPException(400, f"priority must be 0..3, got {value!r}")
            out["priority"] = int(value)
        else:
            out[{"workflow": "workflow_id", "q": "text"}.get(name, name)] = value
    return out
