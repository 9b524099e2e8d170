"""The web view (coordd_web, issue 19) with Starlette's TestClient against a real coordd
holding real data: every page renders, filters and keyset pages, the Host allowlist, the
CSP, and the action checks (token, same origin; with actions off no action answers)."""

from __future__ import annotations

import os
import re
import signal
import sys
from urllib.parse import parse_qs, urlparse

import pytest
from starlette.testclient import TestClient

from coordd.client import SyncClient
from coordd_web.app import Settings, build_app
from coordd_web.security import TOKEN_COOKIE
from tests.integration.webtools import fill, start_web

BASE = "http://127.0.0.1:8787"
ACTION_PATHS = ("/actions/cancel/x", "/actions/retry/x", "/actions/retry-matching",
                "/actions/reap")
SAME = {"sec-fetch-site": "same-origin"}


@pytest.fixture
def filled(daemon):
    return daemon, fill(daemon.socket)


@pytest.fixture
def filled_either(store_daemon):
    """`filled` over either store: a `--db` or a `--store` coordd."""
    return store_daemon, fill(store_daemon.socket)


def same_uid(client, server) -> int:
    """TestClient's requests have no TCP peer: stand in for /proc (coordd_web.peer)."""
    return os.getuid()


def client(socket: str, **kw) -> TestClient:
    kw.setdefault("peer_uid", same_uid)
    return TestClient(build_app(Settings(socket=socket, **kw)), base_url=BASE)


def test_every_page_renders_real_data(filled_either):
    d, ids = filled_either
    with client(d.socket) as web:
        home = web.get("/")
        assert home.status_code == 200
        assert "Jobs by status and priority" in home.text and ids["jobs"][-1] in home.text
        assert 'id="rates-data"' in home.text
        workers = web.get("/workers").text
        assert "w1" in workers and ids["running"] in workers and "lease" in workers
        assert "memory %" in workers and "<polyline" in workers  # the readings sparkline
        assert "<li>slots: 2</li>" in workers and "slots_total" not in workers
        jobs = web.get("/jobs").text
        assert all(j in jobs for j in ids["jobs"])
        job = web.get(f"/jobs/{ids['failed']}")
        assert job.status_code == 200 and "it broke" in job.text
        assert "Attempt 1 on w1" in job.text and "How it ended" in job.text
        waiting = web.get(f"/jobs/{ids['jobs'][1]}").text
        assert "Why isn't it running?" in waiting
        assert "runnable: waiting for a worker to claim it" in waiting  # coordd's explainer
        done = web.get(f"/jobs/{ids['succeeded']}").text
        assert "&#34;ok&#34;: true" in done  # the result
        running = web.get(f"/jobs/{ids['running']}").text
        assert "Held by <b>w1</b>" in running
        assert "loading the model" in running and "lease token 1" in running  # its output
        flows = web.get("/workflows").text
        assert ids["workflow"] in flows
        wf = web.get(f"/workflows/{ids['workflow']}").text
        assert 'id="graph-data"' in wf and '"policy": "run"' in wf and "first" in wf
        agents = web.get("/agents").text
        assert "agent-a" in agents and "hello b" in agents and "agent-b: 1×" in agents
        assert web.get("/jobs/nosuchjob").status_code == 404


def test_jobs_filters_pages_and_capped_counts(filled):
    d, ids = filled
    with client(d.socket) as web:
        beta = web.get("/jobs?kind=beta").text
        shown = set(re.findall(r'data-job="([^"]+)"', beta))
        assert shown == {ids["jobs"][i] for i in range(12) if i % 3 == 0}
        assert "4 matching among the newest" in beta
        assert set(re.findall(r'data-job="([^"]+)"', web.get("/jobs?q=NEEDLE7").text)) \
            == {ids["jobs"][7]}
        assert set(re.findall(r'data-job="([^"]+)"', web.get("/jobs?status=failed").text)) \
            == {ids["failed"]}
        assert set(re.findall(r'data-job="([^"]+)"', web.get("/jobs?worker=w1").text)) \
            == {ids["succeeded"], ids["failed"], ids["running"]}
        wf = set(re.findall(r'data-job="([^"]+)"',
                            web.get(f"/jobs?workflow={ids['workflow']}").text))
        assert len(wf) == 2
        exact = web.get("/jobs?status=waiting&priority=1").text
        assert "3 job(s)" in exact  # from coordd's counters
        assert web.get("/jobs?priority=9").status_code == 400
        assert web.get("/jobs?status=nope").status_code == 400
    import coordd_web.app as app_mod  # page through every job, 5 a page, no repeats
    old, app_mod.JOBS_PAGE = app_mod.JOBS_PAGE, 5
    try:
        with client(d.socket) as web:
            seen, url, pages = [], "/jobs?role=cpu", []
            while url:
                page = web.get(url).text
                pages.append(re.findall(r'data-job="([^"]+)"', page))
                seen += pages[-1]
                m = re.search(r'id="older" href="([^"]+)"', page)
                url = m.group(1).replace("&amp;", "&") if m else None
                if url:
                    assert parse_qs(urlparse(url).query)["role"] == ["cpu"]  # bookmarkable
            assert seen == ids["jobs"][::-1] and len(pages) == 3
            assert 'id="newer"' not in web.get("/jobs?role=cpu").text  # the first page
            back = []  # from the last page, "newer" walks back through the same pages
            while m := re.search(r'id="newer" href="([^"]+)"', page):
                url = m.group(1).replace("&amp;", "&")
                assert parse_qs(urlparse(url).query)["role"] == ["cpu"]
                page = web.get(url).text
                back.append(re.findall(r'data-job="([^"]+)"', page))
            assert back == pages[-2::-1]
    finally:
        app_mod.JOBS_PAGE = old


def test_host_allowlist_and_security_headers(filled):
    d, _ = filled
    with client(d.socket, allow_hosts=("box.example",)) as web:
        assert web.get("/", headers={"host": "evil.example"}).status_code == 403
        assert web.get("/", headers={"host": "127.0.0.1.evil.example:8787"}).status_code == 403
        for bad in ("127.0.0.1:1@evil.example", "[::1]evil.example", "localhost:80:80",
                    "127.0.0.1 evil", "[::1", ""):
            assert web.get("/robots.txt", headers={"host": bad}).status_code == 403, bad
        for host in ("localhost:8787", "[::1]:8787", "127.0.0.1", "box.example:1"):
            assert web.get("/robots.txt", headers={"host": host}).status_code == 200, host
        for path in ("/", "/workers", "/jobs", "/agents", "/workflows"):
            r = web.get(path)
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp
            assert r.headers["x-frame-options"] == "DENY"
            # no inline script: every <script> has a src or is a JSON data block
            for tag in re.findall(r"<script[^>]*>", r.text):
                assert "src=" in tag or 'type="application/json"' in tag, tag
            assert " style=" not in r.text and "<style" not in r.text
            assert not re.search(r"<[^>]+\son[a-z]+=", r.text)  # no inline handlers


def test_with_actions_off_no_action_endpoint_answers(filled):
    d, ids = filled
    with client(d.socket) as web:
        for path in ACTION_PATHS:
            for method in ("POST", "GET"):
                assert web.request(method, path, headers=SAME).status_code == 404, path
        assert web.post(f"/actions/cancel/{ids['jobs'][1]}", headers=SAME).status_code == 404
        assert "hx-post" not in web.get(f"/jobs/{ids['jobs'][1]}").text
    with SyncClient(d.socket) as c:
        assert c.get_job(ids["jobs"][1]).status == "waiting"


def test_actions_need_token_cookie_and_same_origin(filled):
    d, ids = filled
    target = ids["jobs"][1]
    token = "t0ken-for-this-start"
    with client(d.socket, actions=True, token=token) as web:
        assert web.get("/?token=wrong").status_code == 403
        url = f"/actions/cancel/{target}"
        refused = [
            web.post(url),  # no Sec-Fetch-Site at all (curl, an old client)
            web.post(url, headers={"sec-fetch-site": "cross-site", "x-coordd-token": token}),
            web.post(url, headers={**SAME, "origin": "http://evil.example",
                                   "x-coordd-token": token}),
            web.post(url, headers=SAME),  # no token
            web.post(url, headers={**SAME, "x-coordd-token": "wrong"}),
            web.post(url, headers={**SAME, "x-coordd-token": token}),  # header, no cookie
        ]
        assert [r.status_code for r in refused] == [403] * 6
        with SyncClient(d.socket) as c:
            assert c.get_job(target).status == "waiting"
        got = web.get(f"/jobs/{target}?token={token}", follow_redirects=False)
        assert got.status_code == 303 and got.headers["location"] == f"/jobs/{target}"
        assert TOKEN_COOKIE in got.headers["set-cookie"] and "HttpOnly" in got.headers["set-cookie"]
        page = web.get(f"/jobs/{target}").text  # the cookie is kept by the client
        assert 'hx-post="/actions/cancel/' in page and token in page
        ok = web.post(url, headers={**SAME, "origin": BASE, "x-coordd-token": token})
        assert ok.status_code == 200 and "cancelled" in ok.text
        reap = web.post("/actions/reap", headers={**SAME, "x-coordd-token": token})
        assert reap.status_code == 200 and "reaped" in reap.text
        again = web.post(f"/actions/retry-matching?status=failed",
                         headers={**SAME, "x-coordd-token": token})
        assert again.status_code == 200 and "retried 1 job(s)" in again.text
        no_status = web.post("/actions/retry-matching", headers={**SAME, "x-coordd-token": token})
        assert no_status.status_code == 400
    with SyncClient(d.socket) as c:
        assert c.get_job(target).status == "cancelled"
        assert c.get_job(ids["failed"]).status == "waiting"


def test_coordd_down_is_a_clear_503(tmp_path):
    with client(str(tmp_path / "absent.sock")) as web:
        r = web.get("/")
        assert r.status_code == 503 and "coordd is not reachable" in r.text


def test_sse_stream_sends_feed_events_from_a_real_server(store_daemon, tmp_path):
    """The live feed over a real uvicorn: coordd (either store) up, then one message per
    feed reply with the newest event id; resuming from that id starts after it."""
    import httpx
    daemon = store_daemon
    web = start_web(tmp_path, daemon.socket)
    try:
        with SyncClient(daemon.socket) as c:
            head = c.call("feed_head", {})["event_id"]
            with httpx.stream("GET", web.url + f"/events?after={head}", timeout=10) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                lines = r.iter_lines()
                assert next(lines).startswith("retry:")
                got: list[str] = []
                for line in lines:
                    got.append(line)
                    if line.startswith("data: {\"up\": true"):
                        job = c.enqueue(kind="k", required_role="cpu", priority=1).job_id
                    if line.startswith("data: {\"n\""):
                        break
        assert job in got[-1] and any(x.startswith("id: ") for x in got)
        assert int([x for x in got if x.startswith("id: ")][-1][4:]) > head
    finally:
        web.stop()


def test_cli_refuses_a_non_loopback_host():
    import subprocess
    out = subprocess.run([sys.executable, "-m", "coordd_web", "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "loopback" in out.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_cli_exits_0_without_a_traceback_on_a_stop_signal(sig):
    """Ctrl-C printed a KeyboardInterrupt traceback and `kill` left status 143: uvicorn
    raises the signal it stopped for again after its graceful shutdown."""
    import subprocess

    def default_signals() -> None:  # a background job of a script starts with SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    p = subprocess.Popen([sys.executable, "-m", "coordd_web", "--port", "0", "--socket",
                          "/nonexistent/coordd.sock"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        assert "read-only view at http://127.0.0.1:" in p.stdout.readline()
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0 and "Traceback" not in err, (p.returncode, err)


def test_pages_say_resources_reasons_and_ends_in_words(daemon):
    """Issue 19's trial: the workers page words a worker's resources as `coordctl workers`
    does (no raw readings), shows user idle as a duration and no flat count series, and
    merges equal gate verdicts; a job page shows its request and grant (a kind default's
    too); the jobs list says why a waiting job waits, on its own row for phones; the
    overview counts cancelled apart from failed."""
    gpu0 = {"index": 0, "memory_total_mb": 8192, "memory_used_mb": 1024,
            "gpu_temperature_c": 61.0, "utilization_pct": 5.0}
    with SyncClient(daemon.socket, timeout=10) as c:
        for idle in (600.0, 7200.0, 63_780.0):
            c.heartbeat("g1", ["gpu"], {"memory_used_pct": 30.0, "temperature_c": 40.0,
                                        "on_battery": False, "user_idle_s": idle, "gpus": 1,
                                        "gpu_devices": [gpu0], "ram_mb": 16000,
                                        "kind_resources": {"embed": {"vram_mb": 3000}},
                                        "slots_total": 3, "slots": {"embed": 2, "train": 1}})
            c.heartbeat("c1", ["cpu"], {"memory_used_pct": 30.0, "gpus": 0,
                                        "gpu_devices": [], "gpu_reason": "nvidia-ml-py "
                                        "not installed (pip install 'coordd[gpu]')"})
        embed = c.enqueue(kind="embed", required_role="gpu", priority=1).job_id
        got = c.claim("g1", lease_s=60)
        assert got.job.job_id == embed
        lonely = c.enqueue(kind="k", required_role="nobody", priority=2).job_id
        gone = c.enqueue(kind="k", required_role="nobody", priority=3).job_id
        c.cancel(gone)
    with client(daemon.socket) as web:
        workers = web.get("/workers").text
        assert "gpu0: 1024/8192 MiB used, 3000 held, 5192 free, 61°C, 5% busy" in workers
        assert "ram: 16000 MiB, 0 held, 16000 free" in workers
        assert "slots: 3 in all; by kind embed 2, train 1" in workers
        assert "no GPUs: nvidia-ml-py not installed (pip install &#39;coordd[gpu]&#39;)" \
            in workers
        assert "gpu_devices" not in workers and "\\u0027" not in workers
        assert "user idle <b>17h43m</b>" in workers and "10m00s–17h43m" in workers
        assert ">gpus <b>" not in workers  # a count is no sparkline
        assert ('<td colspan="4" class="v ok span" title="P0–P3: ok"><span class="levels">'
                'P0–P3</span> ok</td>') in workers  # P0..P3 alike: one cell, labelled
        job = web.get(f"/jobs/{embed}").text
        assert re.search(r'<td id="resources">none asked \(granted by the kind&#39;s '
                         r"default: gpus 1 \(gpu0\), vram 3000 MiB each\)</td>", job)
        jobs = web.get("/jobs").text
        row = re.search(rf'<tr class="narrow note-row" data-note-of="{lonely}">(.*?)</tr>',
                        jobs, re.S)
        assert row and "no live worker with role nobody" in row.group(1)
        assert f'data-note-of="{embed}"' in jobs  # the lease holder, under the row too
        home = web.get("/").text
        assert re.search(r"0 succeeded, 0 failed \(dead letter\), 0 skipped, 1 cancelled",
                         home)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_cli_stopped_during_start_up_exits_0_without_a_traceback(sig):
    """A stop signal while coordd-web starts (its imports, the app; ~0.3 s) met Python's
    defaults: a KeyboardInterrupt traceback, status 143 or 129. The signal lands here
    while the app is built, before uvicorn runs."""
    import subprocess
    code = ("import os, signal, sys\n"
            "import coordd_web.__main__ as m, coordd_web.app as app\n"
            "real = app.build_app\n"
            "def build(*a, **kw):\n"
            f"    os.kill(os.getpid(), {int(sig)})\n"
            "    return real(*a, **kw)\n"
            "app.build_app = build\n"
            "sys.exit(m.main(['--port', '0', '--socket', '/nonexistent/coordd.sock']))\n")

    def default_signals() -> None:  # a background job of a script starts with SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, preexec_fn=default_signals)
    assert out.returncode == 0 and "Traceback" not in out.stderr, (out.returncode, out.stderr)
