"""A job's captured output through a real coordd on the PostgreSQL store (issue 20): a
real coord-worker ships its model's stderr, `job_logs` and `coordctl logs` read it back,
bad input gets the SQLite path's codes."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.client import Client
from tests.integration.test_coordctl import ctl
from tests.integration.test_pg_daemon import _all_done, pg_db, rig  # noqa: F401 (fixtures)


async def test_worker_output_is_stored_and_read_back_on_the_postgres_daemon(rig):  # noqa: F811
    a = rig.coordd("a")
    await a.wait_serving()
    async with Client(a.socket, timeout=10) as c:
        job = (await c.enqueue(kind="m", required_role="cpu", priority=1,
                               payload={"echo": 1, "stderr": "warn: caf\u00e9\n"})).job_id
        w = rig.worker("w1", [a.socket], claim_wait_s=5)
        [done] = await _all_done(c, [job], 60)
        assert done.status == "succeeded", w.log()
        logs = await c.job_logs(job)
        assert [(c_.stream, c_.pos, c_.data, c_.attempt, c_.worker_id) for c_ in logs.chunks] \
            == [("stderr", 0, "warn: café\n".encode(), 1, "w1")], w.log()
        assert logs.status == "succeeded" and not logs.more
        assert (await c.job_logs(job, after=logs.next_after)).chunks == []
        with pytest.raises(errors.BadRequest, match="limit_bytes must be"):
            await c.job_logs(job, limit_bytes=0)
        with pytest.raises(errors.NotFound, match="job nosuch not found"):
            await c.job_logs("nosuch")
        with pytest.raises(errors.AlreadyCompleted):  # the fence: the job ended
            await c.log_append(job, "w1", logs.chunks[0].token, "stdout", 0, b"late")
        with pytest.raises(errors.BadRequest, match="stream must be one of"):
            await c.log_append(job, "w1", 1, "stdin", 0, b"x")
    raw = ctl(a.socket, "logs", job, "--raw", "--stream", "stderr")
    assert raw.returncode == 0 and raw.stderr.endswith("warn: café\n"), raw
    missing = ctl(a.socket, "logs", "nosuchjob")
    assert missing.returncode == 1 and missing.stderr.startswith("coordctl: not_found:")
