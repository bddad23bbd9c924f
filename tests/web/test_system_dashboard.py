"""The dashboard of the host's system manager, served by one of its users (real local users,
``useradd``): the host's whole queue with each job's user, the others' jobs without what they
run, none of theirs to open, read or cancel; the users by fair share; the user's own jobs in
full, with their log and the metrics of their run, from the store of theirs; and the page
itself in a browser, live."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tandem.place import system_user_store
from tandem.watch.stores.mlflow_store import sqlite_path
from tests.other_user import OtherUser, two_users  # noqa: F401 (the fixture)
from tests.place.test_system import _tandem, system  # noqa: F401 (the fixture)
from tests.timing import scaled, until

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

# Busy (a core) for a second and a half, then its output, with its own metric logged into its run.
WORK = (
    "import os, sys, time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"
    "print('worked as', os.getuid(), flush=True)\n"
)


# The dashboard answers its own user only (tandem.web.peer): its requests are made as them.
CALL = """
import http.client, json, sys
host, port, origin, token, method, path, body = sys.argv[1:8]
conn = http.client.HTTPConnection(host, int(port), timeout=30)
headers = {"Origin": origin, "Content-Type": "application/json"}
if token:
    headers["Authorization"] = "Bearer " + token
conn.request(method, path, body or None, headers)
response = conn.getresponse()
raw = response.read()
try:
    body = json.loads(raw or b"{}")
except ValueError:  # not the API's JSON (a server error's page): shown as it came
    body = {"not json": raw.decode(errors="replace")}
print(json.dumps([response.status, body]))
"""


# The page's event stream, read as the page reads it: "open", then its end ("closed") or the
# first status event that says no manager answers, with why.
STREAM = """
import http.client, json, sys
host, port, origin, token = sys.argv[1:5]
conn = http.client.HTTPConnection(host, int(port), timeout=120)
conn.request("GET", "/api/events", headers={"Origin": origin, "Authorization": "Bearer " + token})
response = conn.getresponse()
print("open", response.status, flush=True)
kind = None
while True:
    line = response.readline()
    if not line:
        print("closed", flush=True)
        break
    line = line.decode().rstrip("\\n")
    if line.startswith("event: "):
        kind = line[len("event: "):]
    elif line.startswith("data: ") and kind == "status" and json.loads(line[6:])["daemon"] is None:
        print("status", json.loads(line[6:])["why_not"], flush=True)
        break
"""


class Page:
    """A user's dashboard, logged in as a script of theirs would be."""

    def __init__(self, user: OtherUser, base: Path, runtime: Path | None = None) -> None:
        """``runtime``: their runtime directory (``TANDEM_RUNTIME_DIR``; else /tmp/tandem-UID)."""
        self.user = user
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close); read when a call fails: what the server said
        self.proc = user.popen(
            user.tandem("dashboard", "--port", "0", "--no-open"),
            env=user.env(
                TANDEM_SYSTEM_DIR=str(base), **({"TANDEM_RUNTIME_DIR": str(runtime)} if runtime else {})
            ),
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert "system manager" in line and "http://" in line, (line, self.said())
        self.url = line.rsplit(": ", 1)[1].strip()
        parts = urlsplit(self.url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.login = (runtime or Path(f"/tmp/tandem-{user.uid}")) / "dashboard" / f"login-{self.port}.html"
        until(self.login.exists, 30, "its login page")
        self.token = ""
        code = re.search(r"#login=([\w-]+)", self.login.read_text()).group(1)  # type: ignore[union-attr]
        status, body = self.call("POST", "/api/login", {"code": code})
        assert status == 200, body
        self.token = body["token"]

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        args = [self.host, str(self.port), self.url.rstrip("/"), self.token, method, path]
        done = self.user.run([self.user.python, "-c", CALL, *args, json.dumps(body) if body else ""])
        assert done.returncode == 0, done.stderr
        status, answer = json.loads(done.stdout)
        return status, answer

    def stream(self) -> subprocess.Popen:
        """The page's event stream, read by a script of theirs (STREAM)."""
        args = [self.host, str(self.port), self.url.rstrip("/"), self.token]
        return self.user.popen([self.user.python, "-c", STREAM, *args], stdout=subprocess.PIPE, text=True)

    def get(self, path: str) -> dict:
        status, body = self.call("GET", path)
        assert status == 200, (path, status, body, self.said())
        return body

    def said(self) -> str:
        """What the dashboard wrote on stderr so far (its last 3,000 characters)."""
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-3000:]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.stderr.close()


def test_a_users_dashboard_shows_the_hosts_queue_by_user_and_theirs_in_full(
    system: Path,  # noqa: F811
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    a, b = two_users
    named = ("submit", "--group", "g", "--name")
    mine = int(_tandem(a, system, *named, "mine", "--", a.python, "-c", WORK).stdout)
    theirs = int(_tandem(b, system, *named, "secret-name", "--", b.python, "-c", WORK).stdout)
    for user, job in ((a, mine), (b, theirs)):
        assert _tandem(user, system, "wait", str(job)).returncode == 0
    page = Page(a, system)
    try:
        jobs = {j["id"]: j for j in page.get("/api/jobs")["jobs"]}
        assert jobs[mine]["user"] == a.name and jobs[mine]["name"] == "mine" and jobs[mine]["command"]
        other = jobs[theirs]
        assert other["user"] == b.name and other["command"] == [] and other["name"] is None, other
        assert "secret-name" not in json.dumps(page.get("/api/jobs"))
        status, said = page.call("GET", f"/api/jobs/{theirs}")
        assert status == 404 and "another user's" in said["error"], said
        status, said = page.call("GET", f"/api/jobs/{theirs}/log")
        assert status == 404 and "another user's" in said["error"], said
        status, said = page.call("POST", f"/api/jobs/{theirs}/cancel")
        assert status != 200 and "another user's" in json.dumps(said), said
        # Their own: whole, its log through the manager, its run's metrics from their store.
        assert "worked as" in page.get(f"/api/jobs/{mine}/log")["text"]
        until(lambda: page.get(f"/api/jobs/{mine}")["mlflow_run_id"], 60, "their job's run recorded")
        until(
            lambda: page.get(f"/api/jobs/{mine}/metrics")["keys"],
            120,
            "their run's metrics, from their store",
        )
        assert {t["job_id"] for t in page.get("/api/timeline")["attempts"]} >= {mine, theirs}
        # A group of theirs: its report their own jobs of that name only, not the other's.
        group = page.get("/api/groups/g")
        assert [r["id"] for r in group["report"]["jobs"]] == [mine], group
        # The host's users by fair share, by name; the counts the host's.
        daemon = page.get("/api/gpus")["daemon"]
        assert {u["name"] for u in daemon["users"]} == {a.name, b.name}, daemon["users"]
        assert page.get("/api/gpus")["counts"].get("succeeded") == 2
        _browse(page, a, b, mine, theirs)
    finally:
        page.close()


BROWSE = """
import json, sys
from playwright.sync_api import sync_playwright
chromium, login, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
theirs, mine, a_name, b_name = sys.argv[4:8]
errors = []
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=args)
    try:
        view = browser.new_context().new_page()
        view.on("pageerror", lambda e: errors.append(str(e)))
        view.goto(login)
        view.wait_for_selector("body[data-ready='/']", timeout=30_000)
        view.wait_for_selector(f"#users-table tr[data-user='{b_name}']", timeout=30_000)
        row = view.inner_text(f"#jobs tr[data-job-id='{theirs}']")
        own = view.inner_text(f"#jobs tr[data-job-id='{mine}']")
        view.click(f"#jobs tr[data-job-id='{mine}'] a")
        view.wait_for_selector(f"body[data-ready='/job/{mine}']", timeout=30_000)
        print(json.dumps({"theirs": row, "mine": own, "errors": errors}))
    finally:
        browser.close()
"""


def _browse(page: Page, a: OtherUser, b: OtherUser, mine: int, theirs: int) -> None:
    """The overview in a browser of theirs: a user column, the users' table; their job's page opens."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("TANDEM_REQUIRE_BROWSER") == "1":
            raise AssertionError("TANDEM_REQUIRE_BROWSER=1 but no chromium: apt-get install chromium")
        return
    pytest.importorskip("playwright.sync_api")
    from tests.web.test_browser import ARGS

    argv = [a.python, "-c", BROWSE, chromium, page.login.as_uri(), json.dumps(ARGS), str(theirs), str(mine)]
    done = a.run([*argv, a.name, b.name], timeout=scaled(120))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert b.name in seen["theirs"] and "secret-name" not in seen["theirs"], seen
    assert a.name in seen["mine"] and not seen["errors"], seen


def test_the_page_says_so_when_the_manager_stops_answering(
    system: Path,  # noqa: F811
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
) -> None:
    """Its reads are the manager's: with the manager gone, a 503 with the reason (the page shows
    it, and asks again), never a bare 500; they are answered again once it is back."""
    a, _ = two_users
    page = Page(a, system)
    try:
        assert page.get("/api/jobs")["jobs"] == []
        stream = page.stream()
        assert stream.stdout is not None and stream.stdout.readline().split() == ["open", "200"]
        env = {**os.environ, "TANDEM_SYSTEM_DIR": str(system)}
        manager = [sys.executable, "-m", "tandem.cli", "daemon"]
        stop = subprocess.run([*manager, "stop"], env=env, capture_output=True, text=True, timeout=scaled(60))
        assert stop.returncode == 0, stop.stderr
        # A job's own pages too: not "no such job", which the page would take as gone.
        paths = ("/api/jobs", "/api/timeline", "/api/jobs?state=queued", "/api/jobs/1", "/api/jobs/1/log")
        for path in paths:
            status, said = page.call("GET", path)
            assert status == 503 and "no daemon serves" in said.get("error", ""), (path, status, said)
        # The live stream stays open, and says why (it broke, with a traceback, before).
        try:
            said_live = stream.communicate(timeout=scaled(30))[0]
        finally:
            stream.kill()
        assert said_live.startswith("status ") and "daemon" in said_live, said_live
        started = [*manager, "start", "--system", "--cpus", "2", "--mem", "4G"]
        again = subprocess.run(started, env=env, capture_output=True, text=True, timeout=scaled(60))
        assert again.returncode == 0, again.stderr
        assert page.get("/api/jobs")["jobs"] == []
    finally:
        page.close()


def test_roots_dashboard_shows_each_users_run_from_their_store_read_as_them(
    system: Path,  # noqa: F811
    two_users: tuple[OtherUser, OtherUser],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Root (the server's administrator) sees each user's job whole, its run's metrics too,
    read from that user's own store as them: a store they made a pipe shows nothing, and
    holds no reader of root's."""
    a, b = two_users
    mine = int(_tandem(a, system, "submit", "--", a.python, "-c", WORK).stdout)
    theirs = int(_tandem(b, system, "submit", "--", b.python, "-c", WORK).stdout)
    for user, job in ((a, mine), (b, theirs)):
        assert _tandem(user, system, "wait", str(job)).returncode == 0
    root = OtherUser("root", 0, 0, tmp_path, sys.executable)
    admin, page = Page(root, system, tmp_path / "runtime"), Page(a, system)
    try:
        for job in (mine, theirs):
            until(lambda job=job: admin.get(f"/api/jobs/{job}")["mlflow_run_id"], 60, f"job {job}'s run")

        def same_keys() -> list[str]:  # root's read of a's run, and a's own, the same (and some)
            keys = admin.get(f"/api/jobs/{mine}/metrics")["keys"]
            return keys if keys and keys == page.get(f"/api/jobs/{mine}/metrics")["keys"] else []

        seen = until(same_keys, 120, "a's run's metrics, to root as to a")
        assert any(k.startswith("system/") for k in seen), seen
        assert until(lambda: admin.get(f"/api/jobs/{theirs}/metrics")["keys"], 120, "b's run's metrics")
        # b makes their store a pipe: root reads b's store as b, a plain file of theirs only,
        # and finds nothing there (opened as a path, it would have waited for a writer).
        monkeypatch.setenv("TANDEM_SYSTEM_DIR", str(system))
        b_store = sqlite_path(system_user_store(b.uid))
        assert b_store is not None
        made = b.run(["sh", "-c", f'mv "{b_store}" "{b_store}.kept" && mkfifo "{b_store}"'])
        assert made.returncode == 0, made.stderr
        status, said = admin.call("GET", f"/api/jobs/{theirs}/metrics")
        assert status == 200 and said["keys"] == [] and said["series"] == {}, said
        # And a's page: b's job is not theirs to read at all.
        assert page.call("GET", f"/api/jobs/{theirs}/metrics")[0] == 404
    finally:
        admin.close()
        page.close()
