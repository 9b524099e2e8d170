"""Wire Structs of governance of running work (coordd.rules.governance). Data only, no I/O."""

from __future__ import annotations

import msgspec


class JobAction(msgspec.Struct, kw_only=True):
    """What coordd.rules.governance says a held job's process must be doing now: `continue`,
    `suspend` (stopped; said on every reply while it stays so), `resume` or `vacate`
    (end it, then `release`), and why."""

    job_id: str
    action: str
    reason: str | None = None


class Suspension(msgspec.Struct, kw_only=True):
    """A lease's governance state as `get_job` shows it (coordd time, seconds)."""

    suspended_at: float | None = None
    suspend_reason: str | None = None  # the reason codes that hold it now, e.g. "user_active"
    vacate_reason: str | None = None  # set once a vacate is decided
    resume_at: float | None = None  # its gates are open: it resumes then if they stay open
