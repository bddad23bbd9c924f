"""The dashboard in a real browser: the distribution's headless Chromium, driven by
Playwright (never a browser download), against a real daemon running real jobs.

Skipped where Chromium or Playwright is missing, unless ``TANDEM_REQUIRE_BROWSER=1`` (as
``.ci/run`` sets it): then their absence fails. ``TANDEM_SCREENSHOTS=DIR`` keeps the
screenshots there (the README's pictures come from such a run)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.other_user import OtherUser, other_user  # noqa: F401 (the fixture)
from tests.timing import scaled
from tests.web.conftest import Dashboard

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRED = os.environ.get("TANDEM_REQUIRE_BROWSER") == "1"
if CHROMIUM is None:
    if REQUIRED:
        raise RuntimeError("TANDEM_REQUIRE_BROWSER=1 but no chromium: apt-get install chromium")
    pytest.skip("no chromium (apt-get install chromium)", allow_module_level=True)
try:
    from playwright import sync_api
except ImportError:
    if REQUIRED:
        raise
    pytest.skip(
        "no playwright (pip install playwright; the browser is the distribution's)", allow_module_level=True
    )

# What Chromium needs to stay off the network here (no update checks, no sync, no GPU).
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-default-apps"]  # fmt: skip


def _non_blank(path: Path) -> bool:
    """More than a handful of colours: a page drew something (a blank one is one colour)."""
    from PIL import Image

    with Image.open(path) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    return colours is None or len(colours) > 20


@pytest.fixture
def browser_page(dashboard: Dashboard, tmp_path: Path):
    shots = Path(os.environ.get("TANDEM_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(20_000)
        seen: dict[str, list[str]] = {"errors": [], "requests": []}
        page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: seen["errors"].append(str(e)))
        page.on("request", lambda r: seen["requests"].append(r.url))
        try:
            yield page, dashboard, shots, seen
        finally:
            browser.close()


def test_a_user_follows_jobs_cancels_one_and_reads_a_log_tail_without_a_reload(browser_page) -> None:
    page, d, shots, seen = browser_page
    cli = d.cli
    page.goto(d.login_url)
    page.wait_for_selector("body[data-ready='/']")
    page.evaluate("window.__sameLoad = 1")  # gone if the page reloads

    # A 3 s job goes queued -> running -> succeeded on the overview, live.
    job = cli.submit(
        "--cpus", "0.5", "--group", "sweep", "--", "sh", "-c", "echo starting; sleep 3; echo done"
    )
    page.wait_for_selector(f"#jobs tr[data-job-id='{job}'][data-state='running']")
    page.wait_for_selector(f"#jobs tr[data-job-id='{job}'][data-state='succeeded']", timeout=30_000)

    # A job held by --after is in the queue with its reason; cancelled from its page.
    blocker = cli.submit("--cpus", "0.5", "--name", "blocker", "--", "sleep", "60")
    held = cli.submit("--after", str(blocker), "--group", "sweep", "--", "true")
    page.wait_for_selector(f"#queue tr[data-job-id='{held}'][data-state='queued']")
    # The daemon's next pass says why (locators: the page's CSP allows no eval, as in a browser).
    page.locator(f"#queue tr[data-job-id='{held}']", has_text=f"after job {blocker}").wait_for()
    page.wait_for_selector(f"#jobs tr[data-job-id='{blocker}'][data-state='running']")
    page.screenshot(path=str(shots / "dashboard-overview.png"), full_page=True)
    assert page.evaluate("window.__sameLoad") == 1

    page.click(f"#jobs tr[data-job-id='{held}'] a")
    page.wait_for_selector(f"#job-head[data-job-id='{held}'][data-state='queued']")
    page.click("#cancel")
    page.wait_for_selector(f"#job-head[data-job-id='{held}'][data-state='cancelled']")
    assert cli.job(held)["state"] == "cancelled"

    # A new log line shows in the tail of a running job's page (the blocker gone: the talker
    # starts at once, however busy the machine is otherwise).
    cli("cancel", str(blocker))
    talker = cli.submit("--cpus", "0.5", "--group", "sweep", "--", "sh", "-c",
                        "echo first; sleep 3; echo second-line-after-load; sleep 20")  # fmt: skip
    page.goto(f"{d.base}#/job/{talker}")
    page.wait_for_selector(f"#job-head[data-job-id='{talker}'][data-state='running']")
    page.locator("#log", has_text="first").wait_for()
    assert "second-line-after-load" not in page.inner_text("#log")
    page.locator("#log", has_text="second-line-after-load").wait_for()
    page.wait_for_selector("#charts .chart", timeout=30_000)  # its run's metrics, from MLflow's file
    page.screenshot(path=str(shots / "dashboard-job.png"), full_page=True)

    page.goto(f"{d.base}#/group/sweep")
    page.wait_for_selector("body[data-ready='/group/sweep']")
    page.wait_for_selector(f"#jobs tr[data-job-id='{job}'][data-state='succeeded']")
    page.wait_for_selector("#group-chart .uplot")  # the sweep's jobs on one axis
    shown = page.inner_text("#view")  # no selection here: no section, and no "null" for it
    assert not any(word in shown for word in ("null", "undefined", "NaN", "[object")), shown
    page.screenshot(path=str(shots / "dashboard-group.png"), full_page=True)

    for name in ("dashboard-overview.png", "dashboard-job.png", "dashboard-group.png"):
        assert _non_blank(shots / name), name
    assert seen["errors"] == []
    outside = [u for u in seen["requests"] if not u.startswith((d.base, "data:", d.login_url))]
    assert outside == [], outside  # everything the page needs comes from the server


# A training loop that waits for the test's word (the file GO), then logs its own metrics
# into the job's MLflow run, step by step.
STEPS = 25
TRAINS = """\
import os, sys, time
import mlflow
deadline = time.monotonic() + 300
while not os.path.exists(sys.argv[1]):
    assert time.monotonic() < deadline, "no word from the test"
    time.sleep(0.05)
for i in range({steps}):
    mlflow.log_metrics({{"loss": 1.0 / (i + 1), "accuracy": i / {steps}}}, step=i)
"""


def test_a_jobs_page_charts_the_loss_the_job_logs_live(browser_page) -> None:
    page, d, shots, seen = browser_page
    script, go = d.cli.tmp / "train.py", d.cli.tmp / "go"
    script.write_text(TRAINS.format(steps=STEPS))
    job = d.cli.submit("--cpus", "0.5", "--", sys.executable, str(script), str(go))
    page.goto(d.login_url)
    page.wait_for_selector("body[data-ready='/']")
    page.goto(f"{d.base}#/job/{job}")
    page.wait_for_selector(f"#job-head[data-job-id='{job}'][data-state='running']", timeout=scaled(20) * 1000)
    page.evaluate("window.__sameLoad = 1")  # gone if the page reloads
    page.locator("#logged", has_text="no metrics logged by the job yet").wait_for()
    assert page.locator("#logged-chart .uplot").count() == 0

    go.touch()  # the job logs loss and accuracy at steps 0..STEPS-1: the page charts them, live
    loss = f"#logged-chart[data-key='loss'][data-axis='step'][data-points='{STEPS}'] .uplot"
    page.wait_for_selector(loss, timeout=scaled(20) * 1000)
    assert page.locator("#logged-metric option").all_inner_texts() == ["accuracy", "loss"]  # its own only
    assert page.locator("#logged-metric").input_value() == "loss"
    assert "attempt 1" in page.inner_text("#logged-chart")  # its line, named in the legend
    page.screenshot(path=str(shots / "dashboard-job-logged.png"), full_page=True)
    page.select_option("#logged-metric", "accuracy")
    page.wait_for_selector(f"#logged-chart[data-key='accuracy'][data-points='{STEPS}'] .uplot")
    assert page.evaluate("window.__sameLoad") == 1
    assert "no metrics logged by the job yet" not in page.inner_text("#logged")
    assert _non_blank(shots / "dashboard-job-logged.png")
    assert seen["errors"] == []


def test_another_users_server_on_another_port_gets_nothing_that_opens_the_dashboard(
    browser_page,
    other_user: OtherUser,  # noqa: F811
) -> None:
    """Logged in, the browser is sent to a server of another local user on another 127.0.0.1
    port (cookies ignore ports; storage does not): what reaches that server (every header,
    every path, what its page could read or fetch in the browser) holds neither the tab's
    token nor a login code, and replayed to the dashboard it opens nothing."""
    page, d, _, seen = browser_page
    assert d.login_url.startswith("file://") and "#" not in d.login_url  # what tandem gave the browser
    spent = d.code()
    page.goto(d.login_url)  # the login page: on to the dashboard with a one-time code
    page.wait_for_selector("body[data-ready='/']")
    assert page.url == f"{d.base}#/", "the spent code left the address bar"
    token = page.evaluate("sessionStorage.getItem('tandem-dashboard-token')")
    assert token and len(token) >= 32 and d.code() != spent
    secrets = [token, d.token, d.code(), spent]
    job = d.cli.submit("--name", "private-job", "--", "true")
    page.wait_for_selector(f"#jobs tr[data-job-id='{job}']")

    log = other_user.home / "received.jsonl"
    recorder = other_user.popen(
        [other_user.python, str(Path(__file__).with_name("recorder.py")), str(log), d.base],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(recorder.stdout.readline())  # type: ignore[union-attr]
        page.goto(f"http://127.0.0.1:{port}/?from=dashboard")
        page.wait_for_function("document.title === 'done'")
        second = page.context.new_page()  # a new tab of the same browser, too
        second.goto(f"http://127.0.0.1:{port}/second")
        second.wait_for_function("document.title === 'done'")
    finally:
        recorder.terminate()
        recorder.wait(10)
    received = [json.loads(line) for line in log.read_text().splitlines()]
    print("the other user's server received:", json.dumps(received, indent=1))
    assert len([r for r in received if r["path"] == "/leak"]) == 2, received
    for request in received:
        names = {name.lower() for name in request["headers"]}
        assert not names & {"cookie", "authorization"}, request
        assert not any(secret in json.dumps(request) for secret in secrets), request
    for leak in (json.loads(r["body"]) for r in received if r["path"] == "/leak"):
        assert leak["cookie"] == "" and leak["session"] == "{}" and leak["local"] == "{}", leak
        assert leak["api/jobs"].startswith(("blocked", "401")) and "private-job" not in json.dumps(leak), leak
        assert leak["login"].startswith(("blocked", "403")), leak
    # What it received, replayed to the dashboard (even from this user's own socket): nothing.
    parts = urlsplit(d.base)
    for request in received:
        headers = {k: v for k, v in request["headers"].items() if k.lower() not in ("host", "content-length")}
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", "/api/jobs", headers={**headers, "Host": parts.netloc})
        response = conn.getresponse()
        assert response.status == 401 and b"private-job" not in response.read(), request
        conn.close()
