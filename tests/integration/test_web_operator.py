"""What a new operator hit in the web view (issue 31 item 7), against a real coordd with
Starlette's TestClient: the jobs list's lease time left is counted from coordd's clock
(it said `lease 20788d22h left`: the page had no `now`); the workers page is one compact
table, a verdict merged over several priorities says which (it read as P1's, drawn
centred under P1); the workflow graph's edge policies have a legend; cancelling a
running job says the cancel was requested (it flashed `job ...: running`)."""

from __future__ import annotations

import re

from coordd.client import SyncClient
from tests.integration.test_web import BASE, SAME, client
from tests.integration.webtools import COOL


def test_the_jobs_list_counts_a_lease_from_coordds_clock(daemon):
    with SyncClient(daemon.socket, timeout=10) as c:
        c.heartbeat("w1", ["cpu"], COOL)
        job = c.enqueue(kind="k", required_role="cpu", priority=1).job_id
        assert c.claim("w1", lease_s=600).job.job_id == job
    with client(daemon.socket) as web:
        for path in ("/jobs", "/jobs?status=running", "/"):
            row = re.search(rf'<tr data-job="{job}".*?</tr>', web.get(path).text, re.S)
            left = re.search(r"lease (\S+) left", row.group(0))
            assert left and re.fullmatch(r"(9m\d\ds|10m00s)", left.group(1)), (path, left)


def test_workers_are_one_compact_table_and_merged_verdicts_name_their_levels(daemon):
    hot = {**COOL, "memory_used_pct": 99.0}  # memory_high at every level: one cell
    with SyncClient(daemon.socket, timeout=10) as c:
        for i in range(7):
            c.heartbeat(f"box-{i}", ["cpu"], hot if i == 3 else COOL)
        c.heartbeat("typist", ["cpu"], {**COOL, "user_idle_s": 1.0})
    with client(daemon.socket) as web:
        page = web.get("/workers").text
    assert page.count('<table class="workers">') == 1 and "<article" not in page
    assert len(re.findall(r'<tr class="worker[ "]', page)) == 8
    assert "8 worker(s), 8 live." in page
    head = re.search(r"<thead>(.*?)</thead>", page, re.S).group(1)
    assert re.findall(r'<th class="v">(P\d)</th>', head) == ["P0", "P1", "P2", "P3"]
    typist = re.search(r'<tr class="worker[^>]*id="w-typist".*?</tr>', page, re.S).group(0)
    cells = re.findall(r'<td(?: colspan="(\d)")? class="v (ok|bad)[^"]*" title="([^"]*)">',
                       typist)
    assert cells == [("3", "ok", "P0–P2: ok"), ("", "bad", "P3: the user is active")]
    assert '<span class="levels">P0–P2</span> ok' in typist
    box3 = re.search(r'<tr class="worker[^>]*id="w-box-3".*?</tr>', page, re.S).group(0)
    assert 'title="P0–P3: memory above the limit"' in box3


def test_the_workflow_graph_has_a_legend_of_its_edge_policies(daemon):
    with SyncClient(daemon.socket, timeout=10) as c:
        wf = c.workflow_submit({"name": "legend", "nodes": [
            {"name": "a", "kind": "k", "required_role": "cpu"},
            {"name": "b", "kind": "k", "required_role": "cpu", "needs": ["a"]},
            {"name": "c", "kind": "k", "required_role": "cpu",
             "needs": [{"node": "a", "policy": "run"}]}]}).workflow_id
        lone = c.workflow_submit({"name": "lone", "nodes": [
            {"name": "a", "kind": "k", "required_role": "cpu"}]}).workflow_id
    with client(daemon.socket) as web:
        page = web.get(f"/workflows/{wf}").text
        legend = re.search(r'<p class="legend" id="edge-legend">(.*?)</p>', page, re.S)
        assert legend, page
        text = re.sub(r"<[^>]+>", "", legend.group(1))
        assert "skip: if the needed node does not succeed, this node is skipped" in text
        assert "run: this node runs once the needed node has ended, whatever its outcome" \
            in text
        assert 'class="edge-run"' in legend.group(1)  # drawn dashed, as in the graph
        assert 'id="edge-legend"' not in web.get(f"/workflows/{lone}").text  # no edges


def test_cancelling_a_running_job_says_the_cancel_was_requested(daemon):
    token = "t0ken"
    with SyncClient(daemon.socket, timeout=10) as c:
        c.heartbeat("w1", ["cpu"], COOL)
        running = c.enqueue(kind="k", required_role="cpu", priority=1).job_id
        assert c.claim("w1", lease_s=600).job.job_id == running
        waiting = c.enqueue(kind="k", required_role="nobody", priority=1).job_id
    with client(daemon.socket, actions=True, token=token) as web:
        web.get(f"/?token={token}")
        said = web.post(f"/actions/cancel/{running}",
                        headers={**SAME, "origin": BASE, "x-coordd-token": token})
        assert said.status_code == 200
        assert f"job {running}: cancel requested; its worker is told at once and stops it" \
            in said.text and ": running" not in said.text
        gone = web.post(f"/actions/cancel/{waiting}",
                        headers={**SAME, "origin": BASE, "x-coordd-token": token})
        assert f"job {waiting}: cancelled" in gone.text
    with SyncClient(daemon.socket) as c:
        assert c.get_job(running).cancel_requested and c.get_job(waiting).status == "cancelled"


def test_a_suspended_jobs_page_says_when_it_resumes(daemon):
    """Issue 31 item 9 on the job page: while a suspended job's gates are open again it
    says when it resumes (and why it is suspended now)."""
    with SyncClient(daemon.socket, timeout=10) as c:
        c.heartbeat("w1", ["cpu"], COOL)
        job = c.enqueue(kind="k", required_role="cpu", priority=3).job_id
        assert c.claim("w1", lease_s=600).job.job_id == job
        c.heartbeat("w1", ["cpu"], {**COOL, "user_idle_s": 1.0})  # the user is back
        with client(daemon.socket) as web:
            page = web.get(f"/jobs/{job}").text
            assert re.search(r"Suspended since [^<]* \(user_active\)\.</p>", page)
            c.heartbeat("w1", ["cpu"], COOL)  # idle again: resumes after resume_after_s
            page = web.get(f"/jobs/{job}").text
        assert re.search(r"Suspended since [^<]* \(user_active\); resumes at \S+ \d\d:\d\d:\d\d "
                         r"if its gates stay open\.</p>", page), page
