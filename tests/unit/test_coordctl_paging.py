"""`coordctl list --all` streams (issue 21, finding 7): each page is printed and flushed
before the next one is asked for, in the table and in `--json` (the same document as
before), and a server that goes back to the start cannot loop it for ever."""

from __future__ import annotations

import io
import json
import sys

import pytest

from coordctl import __main__ as ctl_main
from coordctl import commands
from coordd.wire.protocol import JobList, JobView

PAGE = 3


def _job(i: int) -> JobView:
    return JobView(job_id=f"{i:016x}", kind="k", required_role="cpu", priority=1,
                   effective_priority=1, status="succeeded", attempts=1, max_attempts=3,
                   run_at=0.0, created_at=0.0, updated_at=0.0, age_s=1.0)


class FakeClient:
    """Serves `n` jobs in pages of `limit`; remembers how many pages it served."""

    def __init__(self, n: int, restart_after: int | None = None) -> None:
        self.jobs = [_job(i) for i in range(n)]
        self.calls = 0
        self.restart_after = restart_after

    def list_jobs(self, limit: int, after: str | None = None, **filters) -> JobList:
        self.calls += 1
        if self.restart_after is not None and self.calls > self.restart_after:
            after = None  # a broken server: back to the start
        ids = [j.job_id for j in self.jobs]
        start = 0 if after is None else ids.index(after) + 1
        page = self.jobs[start:start + limit]
        more = start + limit < len(self.jobs)
        return JobList(jobs=page, next_after=page[-1].job_id if more and page else None)


class Recorder(io.TextIOWrapper):
    """stdout that notes, per job id written, how many pages had been fetched by then."""

    def __init__(self, client: FakeClient) -> None:
        self.raw_bytes = io.BytesIO()
        super().__init__(self.raw_bytes, encoding="utf-8", write_through=True)
        self.client = client
        self.seen_at: dict[str, int] = {}

    def _note(self) -> None:
        text = self.raw_bytes.getvalue().decode()
        for j in self.client.jobs:
            if j.job_id not in self.seen_at and j.job_id in text:
                self.seen_at[j.job_id] = self.client.calls

    def write(self, s: str) -> int:
        n = super().write(s)
        self._note()
        return n

    def flush(self) -> None:
        super().flush()
        self._note()

    def isatty(self) -> bool:
        return False

    @property
    def buffer(self):  # `--json` writes bytes
        rec = self

        class Bytes:
            def write(self, b: bytes) -> int:
                n = rec.raw_bytes.write(b)
                rec._note()
                return n

            def flush(self) -> None:
                rec._note()
        return Bytes()


def _run(monkeypatch, client: FakeClient, *argv: str) -> Recorder:
    out = Recorder(client)
    monkeypatch.setattr(sys, "stdout", out)
    args = ctl_main.build_parser().parse_args(["list", "--all", "--limit", str(PAGE), *argv])
    ctl_main._print(commands.list_jobs(client, args), args.json)
    out.flush()
    return out


@pytest.mark.parametrize("as_json", [False, True])
def test_list_all_prints_each_page_before_asking_for_the_next(monkeypatch, as_json):
    client = FakeClient(10)
    out = _run(monkeypatch, client, *(["--json"] if as_json else []))
    assert client.calls == 4
    for i, j in enumerate(client.jobs):
        assert out.seen_at[j.job_id] == i // PAGE + 1, (i, out.seen_at)
    text = out.raw_bytes.getvalue().decode()
    if as_json:
        doc = json.loads(text)
        assert [j["job_id"] for j in doc["jobs"]] == [j.job_id for j in client.jobs]
        assert doc["next_after"] is None and doc["jobs"][0]["kind"] == "k"
    else:
        assert text.count("waiting reason") == 1 and text.rstrip().endswith("10 job(s)")


def test_list_all_json_of_nothing_is_an_empty_document(monkeypatch):
    out = _run(monkeypatch, FakeClient(0), "--json")
    assert json.loads(out.raw_bytes.getvalue()) == {"jobs": [], "next_after": None}


def test_a_server_that_restarts_paging_does_not_loop_us(monkeypatch):
    client = FakeClient(10, restart_after=2)
    out = _run(monkeypatch, client, "--json")
    doc = json.loads(out.raw_bytes.getvalue())
    assert [j["job_id"] for j in doc["jobs"]] == [j.job_id for j in client.jobs[:2 * PAGE]]
    assert client.calls == 3
