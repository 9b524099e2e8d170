"""Bad parameters to the web view's read methods are bad_request / not_found, never
internal: a subnormal job_stats bucket, a message_log cursor that names no message."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.client import SyncClient


def test_job_stats_with_a_subnormal_bucket_is_bad_request(daemon):
    with SyncClient(daemon.socket) as c:
        for window, bucket in ((3600.0, 1e-320), (1e-300, 1e-320), (1e308, 1e-10)):
            with pytest.raises(errors.BadRequest, match="at most"):
                c.call("job_stats", {"window_s": window, "bucket_s": bucket})
        ok = c.call("job_stats", {"window_s": 2.0 ** 1000, "bucket_s": 2.0 ** 993})
        assert len(ok["bucket_starts"]) == 128
        c.status()  # coordd still answers


def test_message_log_cursor_that_names_no_message_is_not_found(daemon):
    with SyncClient(daemon.socket) as c:
        c.send_message("agent-a", "agent-b", {"text": "hi"})
        first = c.call("message_log", {"limit": 1})
        mid = first["messages"][0]["message_id"]
        assert c.call("message_log", {"before": mid})["messages"] == []
        with pytest.raises(errors.NotFound, match="no-such-message"):
            c.call("message_log", {"before": "no-such-message"})


def test_text_filter_folds_ascii_and_matches_other_letters_as_typed(daemon):
    """SQLite's lower() folds ASCII only: the needle is folded the same way, so text
    typed as stored matches (Python's lower() of the needle made 'ÜNÏ' unfindable)."""
    with SyncClient(daemon.socket) as c:
        jid = c.enqueue(kind="k", required_role="cpu", priority=1,
                        payload={"name": "ÜNÏCODE Straße"}).job_id

        def found(text: str) -> bool:
            return jid in [j["job_id"] for j in c.call("find_jobs", {"text": text})["jobs"]]
        assert found("ÜNÏCODE") and found("ÜNÏcode") and found("STRAßE") and found("straße")
