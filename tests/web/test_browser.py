"""The dashboard in a real browser: the distribution's headless Chromium, driven by
Playwright (never a browser download), against a real daemon running real jobs.

Skipped where Chromium or Playwright is missing, unless ``TANDEM_REQUIRE_BROWSER=1`` (as
``.ci/run`` sets it): then their absence fails. ``TANDEM_SCREENSHOTS=DIR`` keeps the
screenshots there (the README's pictures come from such a run)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

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
        page = browser.new_page(viewport={"width": 1280, "height": 900})
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
    outside = [u for u in seen["requests"] if not u.startswith(d.base) and not u.startswith("data:")]
    assert outside == [], outside  # everything the page needs comes from the server
