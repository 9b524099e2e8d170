"""`coordctl list` says why a job is where it is: a job's last error only where it explains
its current state (back to waiting after a failure, release or lost lease; failed,
cancelled, skipped), never an earlier attempt's error beside a running job."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from coordctl import render
from coordd.wire.protocol import JobView, LeaseView

NOW = 1_800_000_000.0
STALE = "released: worker_shutdown"


def _job(status: str, last_error: str | None = STALE, waiting_reason: str | None = None
         ) -> JobView:
    lease = LeaseView(worker_id="w2", token=3, granted_at=NOW, expires_at=NOW + 30,
                      lease_s=30) if status == "running" else None
    return JobView(job_id="0123456789abcdef", kind="train", required_role="cpu", priority=3,
                   effective_priority=3, status=status, attempts=2, max_attempts=3,
                   run_at=NOW, created_at=NOW - 60, updated_at=NOW, age_s=60, lease=lease,
                   last_error=last_error, waiting_reason=waiting_reason)


def _text(fn, *args) -> str:
    out = io.StringIO()
    fn(Console(file=out, width=200, color_system=None), *args)
    return out.getvalue()


@pytest.mark.parametrize("status, shown", [
    ("running", False), ("blocked", False), ("succeeded", False),
    ("waiting", True), ("failed", True), ("cancelled", True), ("skipped", True)])
def test_last_error_is_shown_only_where_it_explains_the_state(status, shown):
    job = _job(status)
    assert render.job_note(job) == (STALE if shown else "")
    assert (STALE in _text(render.job_rows, [job])) is shown


def test_a_waiting_job_says_why_it_waits_before_its_last_error():
    job = _job("waiting", waiting_reason="backoff until 2027-01-15T08:00:00Z")
    assert render.job_note(job) == "backoff until 2027-01-15T08:00:00Z"


def test_show_labels_an_earlier_attempts_error_as_such():
    assert "earlier attempt's error" in _text(render.job, _job("running"))
    text = _text(render.job, _job("failed"))
    assert "last error" in text and "earlier" not in text


def test_show_prints_the_request_and_a_grant_from_the_kinds_default():
    job = _job("running", last_error=None)
    assert "resources" not in _text(render.job, job)
    job.granted = {"gpu_ids": [0], "vram_mb": 6000}  # the kind's default: no own request
    assert render.job_resources(job) == \
        "none asked (granted by the kind's default: gpus 1 (gpu0), vram 6000 MiB each)"
    assert "granted by the kind's default: gpus 1 (gpu0)" in _text(render.job, job)
    job.resources = {"gpus": 1, "vram_mb": 6000}
    assert render.job_resources(job) == \
        "gpus 1, vram 6000 MiB each (granted: gpus 1 (gpu0), vram 6000 MiB each)"
    job.granted = None  # waiting: the request only
    assert render.job_resources(job) == "gpus 1, vram 6000 MiB each"
