"""The web view in a real headless Chromium (Debian's `chromium`, driven by Playwright's
`executable_path`; `playwright install` cannot download here): live updates without a
reload, a job's attempts after its worker was SIGKILLed, the example workflow without a
`build` worker, cancelling from the page. Skipped with a reason where Chromium or
Playwright is absent. Screenshots go to the test's tmp dir (README's come from there)."""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from coordd.client import SyncClient
from tests.integration.workerbench import DAEMON_FAST, MODEL, worker_toml
from tests.integration.webtools import COOL, start_web
from tests import ctlfork

CHROMIUM = os.environ.get("COORDD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--disable-dev-shm-usage"]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "workflow.toml"
WAIT_MS = 20000

playwright_api = pytest.importorskip("playwright.sync_api",
                                     reason="playwright is not installed (the test extra)")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does it "
                "where it can)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def shots(tmp_path):
    """Where screenshots go (COORDD_WEB_SHOTS: a folder to keep them, e.g. for README)."""
    keep = os.environ.get("COORDD_WEB_SHOTS")
    path = Path(keep) if keep else tmp_path / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def rpc(socket: str, method: str, *args, **kw):
    """One coordd call on a thread of its own: Playwright's sync API keeps an event loop
    running on this one, where SyncClient cannot run its own."""
    def run():
        with SyncClient(socket, timeout=10) as c:
            return getattr(c, method)(*args, **kw)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


class Workers:
    """coord-worker processes running the test model (tests/integration/test_worker)."""

    def __init__(self, tmp: Path, socket: str) -> None:
        self.tmp, self.socket, self.procs = tmp, socket, []
        (tmp / "model.py").write_text(MODEL)
        (tmp / "readings.json").write_text(json.dumps(COOL))

    def start(self, worker_id: str, roles: str = "cpu",
              kinds: dict | None = None) -> subprocess.Popen:
        kinds = kinds or {"m": {"argv": [sys.executable, str(self.tmp / "model.py")]}}
        cfg = self.tmp / f"{worker_id}.toml"
        cfg.write_text(worker_toml(self.tmp / f"work-{worker_id}", kinds))
        with open(self.tmp / f"{worker_id}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker", "--worker-id", worker_id, "--roles", roles,
                 "--socket", self.socket, "--config", str(cfg),
                 "--readings-override", str(self.tmp / "readings.json")],
                stdout=log, stderr=log)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


@pytest.fixture
def site(daemon_factory, tmp_path):
    """A coordd (fast reaper, short workflow absence wait), workers, and a web starter."""
    d = daemon_factory(DAEMON_FAST + "workflow_absent_wait_s = 1.5\n")
    d.start()
    workers = Workers(tmp_path, d.socket)
    webs = []

    def web(*args: str):
        w = start_web(tmp_path, d.socket, *args)
        webs.append(w)
        return w
    yield d, workers, web
    workers.close()
    for w in webs:
        w.stop()


def page_of(browser, width: int = 1280, dark: bool = False):
    ctx = browser.new_context(viewport={"width": width, "height": 900},
                              color_scheme="dark" if dark else "light")
    page = ctx.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, errors


def test_overview_shows_a_job_appear_and_finish_live(browser, site, shots):
    d, workers, web = site
    w = web()
    page, errors = page_of(browser)
    page.goto(w.url + "/")
    page.wait_for_selector("#live.ok", timeout=WAIT_MS)  # the SSE stream is open
    page.evaluate("window.__notReloaded = true")
    job = rpc(d.socket, "enqueue", kind="m", required_role="cpu", priority=0,
              payload={"sleep": 1.0}).job_id
    row = f'tr[data-job="{job}"]'
    page.wait_for_selector(f'{row}[data-status="waiting"]', timeout=WAIT_MS)
    workers.start("w1")
    page.wait_for_selector(f'{row}[data-status="running"]', timeout=WAIT_MS)
    page.wait_for_selector(f'{row}[data-status="succeeded"]', timeout=WAIT_MS)
    assert page.evaluate("window.__notReloaded") is True  # swapped in place, no reload
    page.screenshot(path=str(shots / "overview.png"), full_page=True)
    # a hidden tab closes its stream: nothing is swapped in until it shows again
    hide = ("Object.defineProperty(document, 'hidden', {value: %s, configurable: true});"
            "document.dispatchEvent(new Event('visibilitychange'))")
    page.evaluate(hide % "true")
    assert page.evaluate("window.coorddLive.state()") == "closed"
    assert "paused" in page.inner_text("#live")
    later = rpc(d.socket, "enqueue", kind="m", required_role="cpu", priority=0,
                payload={"sleep": 0}).job_id
    rpc(d.socket, "wait_for", later, 20)
    page.wait_for_timeout(1000)
    assert page.locator(f'tr[data-job="{later}"]').count() == 0
    page.evaluate(hide % "false")
    page.wait_for_selector(f'tr[data-job="{later}"][data-status="succeeded"]', timeout=WAIT_MS)
    assert page.evaluate("window.coorddLive.state()") == "open"
    page.keyboard.press("g")
    page.keyboard.press("j")  # keyboard: g j -> the jobs page, "/" -> its text filter
    page.wait_for_url("**/jobs")
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.name") == "q"
    assert errors == []
    page.context.close()
    dark, _ = page_of(browser, dark=True)
    dark.goto(w.url + "/workers")
    dark.wait_for_selector("table.workers svg polyline", state="attached")
    dark.screenshot(path=str(shots / "workers-dark.png"), full_page=True)
    dark.context.close()


def test_job_page_shows_attempts_after_a_worker_was_sigkilled(browser, site, shots):
    d, workers, web = site
    w = web()
    job = rpc(d.socket, "enqueue", kind="m", required_role="cpu", priority=1,
              payload={"sleep": {"w1": 60, "w2": 0.2}}).job_id
    first = workers.start("w1")
    deadline = time.monotonic() + 20
    while rpc(d.socket, "get_job", job).status != "running":
        assert time.monotonic() < deadline, "w1 did not claim"
        time.sleep(0.05)
    page, errors = page_of(browser)
    page.goto(f"{w.url}/jobs/{job}")
    page.wait_for_selector("#live.ok", timeout=WAIT_MS)
    assert "Held by" in page.inner_text("#why")
    first.kill()  # SIGKILL mid-run: the lease lapses, coordd's reaper requeues it
    first.wait(10)
    workers.start("w2")
    page.wait_for_selector('#job[data-status="succeeded"]', timeout=WAIT_MS)
    text = page.inner_text("#timeline")
    assert "Attempt 1 on w1" in text and "Attempt 2 on w2" in text
    assert "handed back to waiting" in text and "succeeded" in text
    assert page.locator("svg.gantt rect.bar").count() == 2
    page.screenshot(path=str(shots / "job-attempts.png"), full_page=True)
    assert errors == []
    page.context.close()


def test_example_workflow_without_build_worker_shows_the_skipped_node(browser, site, shots):
    d, workers, web = site
    w = web()
    story = {s: {"argv": [sys.executable, "-m", "worker.models.story", s, "--payload",
                          "{payload}", "--result", "{result}"]} for s in ("gather", "narrate")}
    workers.start("box1", "gather,narrate", story)
    deadline = time.monotonic() + 20
    while not any(x.live for x in rpc(d.socket, "workers").workers):
        assert time.monotonic() < deadline, "box1 sent no heartbeat"
        time.sleep(0.05)
    out = ctlfork.run(["--socket", d.socket, "--json", "workflow", "submit", str(EXAMPLE)],
                      timeout=30)  # python -m coordctl
    assert out.returncode == 0, out.stderr
    wf_id = json.loads(out.stdout)["workflow_id"]
    page, errors = page_of(browser)
    page.goto(f"{w.url}/workflows/{wf_id}")
    page.wait_for_selector('#graph a[data-node="build"][data-status="skipped"]',
                           timeout=WAIT_MS)  # live, from the feed
    page.wait_for_selector('#graph a[data-node="narrate"][data-status="succeeded"]',
                           timeout=WAIT_MS)
    reason = page.inner_text('tr[data-node="build"] td.reason')
    assert "worker_absent" in reason and "build" in reason
    assert "skip" in page.inner_text("#graph") and "run" in page.inner_text("#graph")
    assert "missing roles" in page.inner_text("ul.summary")
    page.screenshot(path=str(shots / "workflow.png"), full_page=True)
    assert errors == []
    page.context.close()


def test_cancel_a_job_from_the_page_with_actions_on(browser, site, shots):
    d, _workers, web = site
    w = web("--actions")
    assert w.token
    job = rpc(d.socket, "enqueue", kind="m", required_role="nobody", priority=2).job_id
    page, errors = page_of(browser, width=390)  # a phone-width screen
    page.goto(f"{w.url}/jobs/{job}?token={w.token}")  # the printed URL: cookie, redirect
    assert "token" not in page.url
    page.wait_for_selector("#live.ok", timeout=WAIT_MS)
    assert "no live worker with role nobody" in page.inner_text("#why")
    page.on("dialog", lambda dlg: dlg.accept())  # hx-confirm
    page.click("#cancel")
    page.wait_for_selector("#flash .flash.ok", timeout=WAIT_MS)
    page.wait_for_selector('#job[data-status="cancelled"]', timeout=WAIT_MS)
    page.screenshot(path=str(shots / "job-cancelled-phone.png"), full_page=True)
    assert rpc(d.socket, "get_job", job).status == "cancelled"
    assert errors == []
    page.context.close()


def test_phone_width_pages_keep_notes_and_verdicts_readable(browser, site, shots):
    """At 390 px a job's note (a long error, a waiting reason) sits on its own full-width
    row under the job, and nothing is cut off at the right: the jobs table and a worker's
    gate table fit the screen. The overview's time axis is 24-hour."""
    d, _workers, web = site
    w = web()
    rpc(d.socket, "heartbeat", "w-ok", ["cpu"], COOL)
    rpc(d.socket, "heartbeat", "hot", ["gpu"], {**COOL, "memory_used_pct": 99.0,
                                                "temperature_c": 97.0, "on_battery": True,
                                                "user_idle_s": 0.0})
    bad = rpc(d.socket, "enqueue", kind="embed", required_role="cpu", priority=0).job_id
    got = rpc(d.socket, "claim", "w-ok", lease_s=60)
    assert got.job.job_id == bad
    rpc(d.socket, "fail", bad, "w-ok", got.lease.token, "permanent: exit 1: embed model not "
        "installed (missing: the embed extra (all-MiniLM-L6-v2)); install it from the "
        "coordd checkout", retryable=False)
    lonely = rpc(d.socket, "enqueue", kind="k", required_role="nobody", priority=2).job_id
    page, errors = page_of(browser, width=390)
    for path in ("/jobs", "/"):
        page.goto(w.url + path)
        for job in (bad, lonely):
            note = page.locator(f'tr.note-row[data-note-of="{job}"] td')
            assert note.is_visible() and note.bounding_box()["width"] > 300, (path, job)
        assert page.locator("td.note").first.is_hidden()  # the column folds away
        fits = page.evaluate("[...document.querySelectorAll('table.jobs')].every("
                             "t => t.parentElement.scrollWidth <= t.parentElement.clientWidth)")
        assert fits, path
    assert "no live worker with role nobody" in page.inner_text(f'[data-note-of="{lonely}"]')
    page.screenshot(path=str(shots / "overview-phone.png"), full_page=True)
    page.goto(w.url + "/workers")
    fits = page.evaluate("[...document.querySelectorAll('table.workers')].every("
                         "t => t.parentElement.scrollWidth <= t.parentElement.clientWidth)")
    assert fits and "on battery" in page.inner_text("#w-hot")
    page.screenshot(path=str(shots / "workers-phone.png"), full_page=True)
    page.context.close()
    wide, wide_errors = page_of(browser)
    wide.goto(w.url + "/")
    wide.wait_for_function("window.coorddChart && window.coorddChart.axes[0]._values")
    ticks = wide.evaluate("window.coorddChart.axes[0]._values")
    assert ticks and all(re.fullmatch(r"[0-2]\d:[0-5]\d", t) for t in ticks), ticks
    wide.close()
    assert errors == [] and wide_errors == []


def test_seven_workers_fit_a_screen_and_the_chart_tells_its_series_apart(browser, site,
                                                                          shots):
    """Issue 31 item 7: one card per worker made seven workers a long scroll (2,725 px at
    1280 wide); a verdict merged over P0..P2 was centred, under the P1 header; the chart
    drew `skipped` and `failed %` in one colour."""
    d, _workers, web = site
    w = web()
    for i in range(6):
        rpc(d.socket, "heartbeat", f"box-{i}", ["cpu"], {**COOL, "slots_total": 2})
    rpc(d.socket, "heartbeat", "typist", ["cpu"], {**COOL, "user_idle_s": 1.0})
    job = rpc(d.socket, "enqueue", kind="k", required_role="cpu", priority=0).job_id
    assert rpc(d.socket, "claim", "box-0", lease_s=600).job.job_id == job
    page, errors = page_of(browser)
    page.goto(w.url + "/workers")
    assert page.locator("table.workers tr.worker").count() == 7
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height <= 900, height  # the viewport: no scroll
    p0 = page.locator("table.workers th.v").first.bounding_box()
    cell = page.locator("#w-typist td.v").first
    assert cell.get_attribute("colspan") == "3"
    text_x = cell.evaluate("el => { const r = document.createRange(); "
                           "r.selectNodeContents(el); return r.getBoundingClientRect().x; }")
    assert p0["x"] <= text_x < p0["x"] + p0["width"] / 2  # it reads from P0 on
    page.screenshot(path=str(shots / "workers.png"), full_page=True)
    page.goto(w.url + "/")
    page.wait_for_function("window.coorddChart")
    series = page.evaluate("(() => { const u = window.coorddChart; return u.series.slice(1)"
                           ".map((s, i) => [s.label, typeof s.stroke === 'function' ? "
                           "s.stroke(u, i + 1) : s.stroke]); })()")
    assert [label for label, _ in series] == ["succeeded", "failed", "skipped", "cancelled",
                                              "failed %"]
    strokes = [stroke for _, stroke in series]
    assert len(set(strokes)) == len(strokes), series
    assert errors == []
    page.context.close()


def test_a_node_named_like_an_object_property_is_drawn(browser, site):
    """dagre keys nodes in plain objects: nodes named __proto__ / constructor broke the
    graph (a JS error, nothing drawn) until graph.js prefixed the ids."""
    d, _workers, web = site
    w = web()
    wf = rpc(d.socket, "workflow_submit", {"name": "proto", "nodes": [
        {"name": "__proto__", "kind": "k", "required_role": "cpu"},
        {"name": "b", "kind": "k", "required_role": "cpu", "needs": ["__proto__"]},
        {"name": "constructor", "kind": "k", "required_role": "cpu", "needs": ["b"]}]})
    page, errors = page_of(browser)
    page.goto(f"{w.url}/workflows/{wf.workflow_id}")
    page.wait_for_selector('#graph a[data-node="constructor"]', timeout=WAIT_MS)
    names = page.eval_on_selector_all("#graph a[data-node]",
                                      "els => els.map(e => e.dataset.node).sort()")
    assert names == ["__proto__", "b", "constructor"]
    assert errors == []
    page.context.close()
