"""Pure shaping of coordd's replies for the pages: times and ages in words, a job's event
log as attempts, sparkline and Gantt geometry (drawn as SVG by the templates: SVG
attributes need no inline style, so the CSP stays strict). No I/O.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode

from coordctl.render import fmt_age, resource_lines  # one duration format for CLI and web

BLOB_CHARS_MAX = 20000
TRAIL_MAX = 50  # newer-page cursors a jobs URL carries (about 850 characters)
CURSOR = re.compile(r"[0-9A-Za-z_.-]{1,64}")
SPARK_W, SPARK_H = 120, 24
GANTT_W = 900
SPARK_KEYS = ("memory_used_pct", "temperature_c", "gpu_memory_used_pct", "gpu_temperature_c",
              "user_idle_s", "power_w", "battery_pct")
SPARK_LABELS = {"memory_used_pct": "memory %", "temperature_c": "temp °C",
                "gpu_memory_used_pct": "GPU mem %", "gpu_temperature_c": "GPU °C",
                "user_idle_s": "user idle", "power_w": "power W", "battery_pct": "battery %"}
SPARK_DURATIONS = ("user_idle_s",)  # shown as durations (17h43m), not raw seconds
# capacities and counts a heartbeat carries: not readings worth a sparkline
NOT_SPARKS = ("gpus", "slots_total", "ram_mb")
GATE_WORDS = {
    "memory_high": "memory above the limit", "too_hot": "too hot",
    "on_battery": "on battery", "user_active": "the user is active",
    "heartbeat_stale": "no fresh heartbeat", "no_matching_role": "no matching role",
}


def fmt_time(ts: float | None) -> str:
    """A Unix time as `YYYY-MM-DD HH:MM:SS` UTC ("-" for None; never raises)."""
    if ts is None:
        return "-"
    if not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return f"{ts!r} (not a valid time)"
    try:
        return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"{ts!r} (not a valid time)"


def fmt_blob(value: Any) -> str:
    """Pretty JSON, cut at BLOB_CHARS_MAX characters."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) > BLOB_CHARS_MAX:
        text = text[:BLOB_CHARS_MAX] + f"\n... [{len(text) - BLOB_CHARS_MAX} more characters]"
    return text


def summary_item(item: Any) -> str:
    """One entry of a workflow summary list: a node name, or `node (reason)`."""
    if isinstance(item, dict):
        node = item.get("node", "?")
        return f"{node} ({item['reason']})" if item.get("reason") else str(node)
    return str(item)


def gate_words(codes: list[str]) -> str:
    """Gate refusal codes in plain words ("ok" for none)."""
    return "; ".join(GATE_WORDS.get(c, c) for c in codes) if codes else "ok"


@dataclass
class Step:
    """One line of an attempt: when (and how long after the attempt began), what, who."""

    at: float
    offset_s: float
    words: str
    worker_id: str | None
    status: str


@dataclass
class Attempt:
    """The events from one claim to the next (attempt 0: before the first claim)."""

    number: int
    worker_id: str | None
    start: float
    end: float | None = None
    outcome: str | None = None
    steps: list[Step] = field(default_factory=list)


def _words(ev: Any, job: Any, last: bool) -> str:
    reason = f" ({ev.reason})" if ev.reason else ""
    to, frm = ev.to_status, ev.from_status
    if frm is None and to in ("waiting", "blocked"):
        return "queued" + (" behind its dependencies" if to == "blocked" else "") + reason
    if to == "running" and frm != "running":
        return f"claimed by {ev.worker_id or 'a worker'}" + reason
    if to == "running":
        return (ev.reason or "lease changed") + (f" on {ev.worker_id}" if ev.worker_id else "")
    if frm == "running" and to == "waiting":
        words = "handed back to waiting" + reason
        if last and job.status == "waiting" and job.run_at > ev.at:
            words += f"; backoff until {fmt_time(job.run_at)}"
        return words
    if frm == "running" and to in ("succeeded", "failed", "cancelled", "skipped"):
        return to + reason
    if frm == "blocked" and to == "waiting":
        return "dependencies done: waiting" + reason
    return f"{frm or 'new'} → {to}{reason}"


def attempts(job: Any) -> list[Attempt]:
    """A JobView's event log split at each claim, each step in plain words."""
    out: list[Attempt] = []
    cur: Attempt | None = None
    events = list(job.events)
    for i, ev in enumerate(events):
        claimed = ev.to_status == "running" and ev.from_status != "running"
        if claimed or cur is None:
            if cur is not None and cur.end is None:
                cur.end = ev.at
            cur = Attempt(number=len([a for a in out if a.number]) + (1 if claimed else 0),
                          worker_id=ev.worker_id if claimed else None, start=ev.at)
            out.append(cur)
        cur.steps.append(Step(at=ev.at, offset_s=ev.at - cur.start,
                              words=_words(ev, job, i == len(events) - 1),
                              worker_id=ev.worker_id, status=ev.to_status))
        if cur.number and ev.from_status == "running" and ev.to_status != "running":
            cur.end, cur.outcome = ev.at, ev.to_status
    return out


def spark_points(values: list[float], w: int = SPARK_W, h: int = SPARK_H) -> str:
    """An SVG polyline's points for `values`, scaled to w x h (empty for none)."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    step = w / max(1, len(values) - 1)
    if hi == lo:  # a steady reading: a line across the middle
        return " ".join(f"{i * step:.1f},{h / 2:.1f}" for i in range(len(values)))
    return " ".join(f"{i * step:.1f},{h - 2 - (v - lo) / (hi - lo) * (h - 4):.1f}"
                    for i, v in enumerate(values))


def _spark_value(key: str, v: float) -> str:
    return fmt_age(v) if key in SPARK_DURATIONS else f"{v:.1f}"


def sparklines(history: list[tuple[float, dict[str, float]]]) -> list[dict[str, Any]]:
    """The sparklines of one worker: SPARK_KEYS first, then other GPU and power readings
    that change (a constant extra series, or a count like `gpus`, says nothing), six at
    most; `last` and `range` as text (durations in words)."""
    keys: list[str] = [k for k in SPARK_KEYS if any(k in r for _, r in history)]
    for _, r in history:
        for k in r:
            if k not in keys and k not in NOT_SPARKS and ("gpu" in k or "power" in k) \
                    and len({h[k] for _, h in history if k in h}) > 1:
                keys.append(k)
    out = []
    for k in keys[:6]:
        vals = [r[k] for _, r in history if k in r]
        lo, hi = min(vals), max(vals)
        rng = (f"{fmt_age(lo)}–{fmt_age(hi)}" if k in SPARK_DURATIONS
               else f"{lo:.0f}–{hi:.0f}")
        out.append({"key": k, "label": SPARK_LABELS.get(k, k), "points": spark_points(vals),
                    "last": _spark_value(k, vals[-1]), "range": rng, "min": lo, "max": hi,
                    "n": len(vals)})
    return out


def resource_words(w: Any) -> list[str]:
    """A worker's resources in plain words, as `coordctl workers` says them (per GPU
    used/total, held, free, temperature; RAM; reservations), then its slots by kind and,
    with no GPU, why (the probe's reason)."""
    out = resource_lines(w.resources or {})
    r = w.readings or {}
    reason = r.get("gpu_reason")
    if not (w.resources or {}).get("gpus") and isinstance(reason, str) and reason:
        out.append(f"no GPUs: {reason}")
    slots = r.get("slots")
    total = r.get("slots_total")
    if isinstance(slots, dict) and slots:
        each = ", ".join(f"{k} {v}" for k, v in sorted(slots.items()))
        out.append(f"slots: {total} in all; by kind {each}" if total is not None
                   else f"slots by kind: {each}")
    elif total is not None:
        out.append(f"slots: {total}")
    return out


def verdict_cells(verdicts: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The gate verdicts P0..P3 as cells, neighbours with the same verdict merged into
    one (`span` columns): four "no fresh heartbeat" are one cell, not four. `levels`
    names the priorities a cell covers ("P0–P2"), for a label that keeps a merged
    verdict from reading as the one of the column it is drawn under."""
    cells: list[dict[str, Any]] = []
    for i, p in enumerate(("p0", "p1", "p2", "p3")):
        codes = list(verdicts.get(p, []))
        if cells and cells[-1]["codes"] == codes:
            cells[-1]["span"] += 1
            cells[-1]["levels"] = f"P{i - cells[-1]['span'] + 1}–P{i}"
        else:
            cells.append({"codes": codes, "span": 1, "words": gate_words(codes),
                          "levels": f"P{i}"})
    return cells


def gantt(runs: list[Any], now: float, w: int = GANTT_W) -> dict[str, Any]:
    """Bars (x, width in px of `w`) of a workflow's node runs on one time axis."""
    if not runs:
        return {"bars": [], "start": now, "end": now, "w": w, "h": 0}
    start = min(r.start for r in runs)
    end = max((r.end if r.end is not None else now) for r in runs)
    span = max(end - start, 1e-3)
    rows: dict[str, int] = {}
    bars = []
    for r in runs:
        row = rows.setdefault(r.node, len(rows))
        stop = r.end if r.end is not None else now
        x = (r.start - start) / span * (w - 160)
        bars.append({"node": r.node, "job_id": r.job_id, "worker": r.worker_id,
                     "x": 150 + x, "w": max(2.0, (stop - r.start) / span * (w - 160)),
                     "y": 4 + row * 26, "ty": 21 + row * 26, "outcome": r.outcome or "running",
                     "dur": stop - r.start})
    return {"bars": bars, "rows": rows, "start": start, "end": end, "span": span, "w": w,
            "h": 8 + len(rows) * 26}


def timeline_bars(attempt_list: list[Attempt], job: Any, now: float,
                  w: int = GANTT_W) -> list[dict[str, Any]]:
    """One bar per claimed attempt on the job's own time axis (created .. last event)."""
    real = [a for a in attempt_list if a.number]
    if not real:
        return []
    start = job.created_at
    end = max([(a.end if a.end is not None else now) for a in real] + [start + 1e-3])
    span = end - start
    return [{"n": a.number, "worker": a.worker_id, "outcome": a.outcome or "running",
             "x": 150 + (a.start - start) / span * (w - 160),
             "w": max(2.0, ((a.end if a.end is not None else now) - a.start) / span * (w - 160)),
             "y": 4 + i * 26, "ty": 21 + i * 26,
             "dur": (a.end if a.end is not None else now) - a.start}
            for i, a in enumerate(real)]


def output(chunks: list[Any]) -> list[dict[str, Any]]:
    """Captured model output grouped by lease (one run): attempt, worker, token, and the
    text of each stream, decoded leniently."""
    runs: dict[int, dict[str, Any]] = {}
    for ch in chunks:
        run = runs.setdefault(ch.token, {"attempt": ch.attempt, "worker": ch.worker_id,
                                         "token": ch.token, "streams": {}, "at": ch.at})
        run["streams"][ch.stream] = run["streams"].get(ch.stream, "") + \
            bytes(ch.data).decode("utf-8", "replace")
    return sorted(runs.values(), key=lambda r: r["token"])


def pager(filters: dict[str, str], before: str | None, trail: str | None,
          next_before: str | None) -> dict[str, str | None]:
    """The jobs list's `older` and `newer` links (keyset, stateless): an older link
    carries the page's own cursor on its `trail`, so its newer link goes back to exactly
    this page; past TRAIL_MAX pages (or on a trail cut short) newer is the first page."""
    base = {k: v for k, v in filters.items() if v}
    steps = [t for t in (trail or "").split(",") if CURSOR.fullmatch(t)][-TRAIL_MAX:]
    older = None
    if next_before:
        up = [*steps, before][-TRAIL_MAX:] if before else []
        older = "/jobs?" + urlencode({**base, "before": next_before,
                                      **({"trail": ",".join(up)} if up else {})})
    newer = None
    if before is not None:
        back = dict(base)
        if steps:
            back["before"] = steps[-1]
            if steps[:-1]:
                back["trail"] = ",".join(steps[:-1])
        newer = "/jobs?" + urlencode(back)
    return {"older": older, "newer": newer}
