"""The dashboard over a real socket, against a real daemon: who may use it, and its JSON API
(the field names of ``tandem ls --json`` / ``show --json``, paging, logs, no environment)."""

from __future__ import annotations

import http.client
import json
import os
import stat
import sys
from urllib.parse import urlsplit

import psutil

from tests.other_user import OtherUser, other_user  # noqa: F401 (the fixture)
from tests.web.conftest import Dashboard, wait_for


def _call(d: Dashboard, path: str, method: str = "GET", headers: dict | None = None, auth: bool = True):
    parts = urlsplit(d.base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    sent = {
        "Host": parts.netloc,
        **({"Authorization": f"Bearer {d.token}"} if auth else {}),
        **(headers or {}),
    }
    conn.request(method, path, headers=sent)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), body


def _json(d: Dashboard, path: str) -> dict:
    status, _, body = _call(d, path)
    assert status == 200, body
    return json.loads(body)


def test_access_needs_a_session_token_a_loopback_host_and_same_origin_writes(dashboard: Dashboard) -> None:
    d = dashboard
    held = d.cli.submit("--after", str(d.cli.submit("--", "sleep", "30")), "--", "true")
    assert _call(d, "/api/jobs", auth=False)[0] == 401
    assert _call(d, "/api/jobs", auth=False, headers={"Authorization": "Bearer forged"})[0] == 401
    status, headers, page = _call(d, "/", auth=False)  # the page and its scripts: nothing secret
    assert status == 200 and b"app.js" in page and "set-cookie" not in {k.lower() for k in headers}
    assert _call(d, "/static/app.js", auth=False)[0] == 200
    # The login page: 0600, a one-time code that gives one session token and is then spent;
    # the page holds a new one; no cookie is ever set.
    assert stat.S_IMODE(os.stat(d.login_page).st_mode) == 0o600
    code = d.code()
    status, body = d.log_in(code)
    assert status == 200 and len(body["token"]) >= 32 and body["token"] != d.token
    assert d.log_in(code)[0] == 401, "a spent code gives nothing"
    assert d.code() != code and f"{d.base}#login=" in d.login_page.read_text()
    assert _call(d, "/api/jobs", auth=False, headers={"Authorization": f"Bearer {body['token']}"})[0] == 200
    assert d.log_in("")[0] == 401 and d.log_in("x" * 43)[0] == 401
    cross_login = _call(d, "/api/login", "POST", headers={"Origin": "http://127.0.0.1:18999"})
    assert cross_login[0] == 403  # another port's page may not even try a code
    assert _call(d, "/api/jobs", headers={"Host": "attacker.example:80"})[0] == 403  # DNS rebinding
    assert _call(d, "/", auth=False, headers={"Host": "attacker.example:80"})[0] == 403
    port = urlsplit(d.base).port
    for host in (f"127.0.0.1:{port}@evil", f"127.0.0.1:{port + 1}", "127.0.0.1", f"localhost:{port}x"):
        assert _call(d, "/api/jobs", headers={"Host": host})[0] == 403, host  # not this server's port
    assert _call(d, "/api/jobs", headers={"Host": f"LocalHost:{port}"})[0] == 200
    cross = _call(d, f"/api/jobs/{held}/cancel", "POST", headers={"Origin": "http://attacker.example"})
    assert cross[0] == 403 and d.cli.job(held)["state"] == "queued"
    other_port = _call(d, f"/api/jobs/{held}/cancel", "POST", headers={"Origin": "http://127.0.0.1:18999"})
    assert other_port[0] == 403 and d.cli.job(held)["state"] == "queued"
    assert _call(d, f"/api/jobs/{held}/cancel", "POST")[0] == 403  # no Origin at all: refused too
    same = _call(d, f"/api/jobs/{held}/cancel", "POST", headers={"Origin": d.base.rstrip("/")})
    assert same[0] == 200 and json.loads(same[2])["cancelled"] == [held]
    assert d.cli.job(held)["state"] == "cancelled"


def test_the_api_speaks_ls_json_and_never_sends_an_environment(dashboard: Dashboard) -> None:
    d = dashboard
    secret = "s3cr3t-value-not-to-serve"
    d.cli.env["MY_API_KEY"] = secret
    printer = d.cli.submit(
        "--name", "printer", "--group", "g", "--", "sh", "-c", "for i in 1 2 3; do echo line $i; done"
    )
    other = d.cli.submit("--group", "g", "--", "true")
    d.cli("wait", str(printer), str(other), timeout=60)
    listed = {j["id"]: j for j in d.cli.json("ls", "--all")}
    page = _json(d, "/api/jobs?limit=1")
    (newest,) = page["jobs"]
    assert newest["id"] == other and page["next_before"] == other
    assert set(newest) == set(listed[other])
    older = _json(d, f"/api/jobs?limit=1&before={page['next_before']}")
    assert [j["id"] for j in older["jobs"]] == [printer] and older["next_before"] is None
    for _ in range(10):  # read both again if the daemon wrote the job (its MLflow run id) in between
        one = _json(d, f"/api/jobs/{printer}")
        shown = d.cli.json("show", str(printer))
        if one["updated"] == shown["updated"] == _json(d, f"/api/jobs/{printer}")["updated"]:
            break
    assert {k: one[k] for k in shown if k not in ("wait_s", "run_s")} == {
        k: v for k, v in shown.items() if k not in ("wait_s", "run_s")
    }
    assert _json(d, "/api/jobs?state=succeeded")["jobs"] and not _json(d, "/api/jobs?state=queued")["jobs"]
    assert _call(d, "/api/jobs?state=nonsense")[0] == 400
    assert _call(d, "/api/jobs/999999")[0] == 404
    log = _json(d, f"/api/jobs/{printer}/log")
    assert log["text"] == "line 1\nline 2\nline 3\n" and log["offset"] == len(log["text"])
    assert _json(d, f"/api/jobs/{printer}/log?offset=7")["text"] == "line 2\nline 3\n"
    group = _json(d, "/api/groups/g")
    assert sorted(j["id"] for j in group["jobs"]) == [printer, other]
    wait_for(lambda: _json(d, f"/api/jobs/{printer}")["mlflow_run_id"], 30, "the job's MLflow run")
    # The run is made before the job starts; its samples are forwarded to it within seconds.
    wait_for(lambda: _json(d, f"/api/jobs/{printer}/metrics?points=3")["keys"], 30, "the run's metrics")
    metrics = _json(d, f"/api/jobs/{printer}/metrics?points=3")
    assert metrics["keys"] and all(len(points) <= 3 for points in metrics["series"].values())
    for path in ("/api/jobs", f"/api/jobs/{printer}", "/api/queue", "/api/groups/g", "/api/timeline"):
        assert secret not in _call(d, path)[2].decode(), path
    assert "env" not in one


# A training loop that logs its own metrics into the job's MLflow run: ``loss`` at steps
# 0..STEPS-1, and a ``lr`` logged with no step (MLflow's 0 for each point).
STEPS = 12
LOGS_LOSS = f"""\
import mlflow
for i in range({STEPS}):
    mlflow.log_metric("loss", 1.0 / (i + 1), step=i)
for lr in (0.1, 0.05, 0.01):
    mlflow.log_metric("lr", lr)
"""


def test_a_jobs_own_metrics_come_back_by_step_apart_from_the_hardware_series(dashboard: Dashboard) -> None:
    d = dashboard
    script = d.cli.tmp / "train.py"
    script.write_text(LOGS_LOSS)
    job = d.cli.submit("--cpus", "0.5", "--", sys.executable, str(script))
    assert d.cli("wait", str(job), timeout=180).returncode == 0, d.cli("logs", str(job)).stdout
    hardware = "system/process_tree/cpu_percent"  # forwarded to the run every 2 s: maybe after the job
    wait_for(lambda: hardware in _json(d, f"/api/jobs/{job}/metrics?points=1")["keys"], 30, "its samples")
    m = _json(d, f"/api/jobs/{job}/metrics?by=step&key=loss")
    assert m["series"] == {"loss": [[float(i), 1.0 / (i + 1)] for i in range(STEPS)]}
    assert m["axis"] == {"loss": "step"} and m["run_id"] == _json(d, f"/api/jobs/{job}")["mlflow_run_id"]
    # The job's own keys, and only those (tandem.watch's system/ and summary/ are its, not the job's).
    assert m["logged_keys"] == ["loss", "lr"] and hardware in m["keys"]
    assert _json(d, f"/api/jobs/{job}/metrics?by=step&key=loss&attempt=1")["series"] == m["series"]
    few = _json(d, f"/api/jobs/{job}/metrics?by=step&key=loss&points=4")["series"]["loss"]
    assert [s for s, _ in few] == [1.0, 4.0, 7.0, 10.0]  # buckets of 3 steps, averaged
    # Points that all share one step are charted over time: MLflow's own timestamps, in seconds.
    lr = _json(d, f"/api/jobs/{job}/metrics?by=step&key=lr")
    assert lr["axis"] == {"lr": "time"} and all(t > 1e9 for t, _ in lr["series"]["lr"])
    assert _call(d, f"/api/jobs/{job}/metrics?attempt=2")[0] == 404
    assert _call(d, f"/api/jobs/{job}/metrics?by=epoch")[0] == 400
    # The live stream says which of a run's new points are the job's own: the page asks anew.
    followed = _events(d, f"/api/events?job={job}", None, '"logged_keys": ["loss", "lr"]')
    assert "event: metrics" in followed and '"logged_keys": ["loss", "lr"]' in followed


def _events(d: Dashboard, path: str, headers: dict | None, until: str, timeout: float = 15.0) -> str:
    """The event stream's text until ``until`` is in it."""
    parts = urlsplit(d.base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    conn.request(
        "GET", path, headers={"Host": parts.netloc, "Authorization": f"Bearer {d.token}", **(headers or {})}
    )
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
    text = ""
    try:
        while until not in text:
            line = response.fp.readline()
            if not line:
                break
            text += line.decode()
    finally:
        conn.close()
    return text


def test_the_event_stream_sends_changes_and_resumes_where_a_reconnect_left_off(dashboard: Dashboard) -> None:
    d = dashboard
    first = d.cli.submit("--", "true")
    d.cli("wait", str(first), timeout=60)
    text = _events(d, "/api/events?since=0", None, '"state": "succeeded"')
    ids = [line[4:] for line in text.splitlines() if line.startswith("id: ")]
    assert "event: jobs" in text and f'"id": {first}' in text and ids
    cursor = json.loads(ids[-1])
    # A job that ends while the browser is away: a reconnect with the last id it saw gets it.
    second = d.cli.submit("--", "sh", "-c", "echo from-the-second")
    d.cli("wait", str(second), timeout=60)
    again = _events(d, "/api/events", {"Last-Event-ID": json.dumps(cursor)}, f'"id": {second}')
    assert (
        f'"id": {second}' in again
        and json.loads(again.split("id: ")[1].split("\n")[0])["since"] > cursor["since"]
    )
    followed = _events(d, f"/api/events?job={second}", None, '"text": "from-the-second')
    assert "event: log" in followed  # the job's output, from offset 0


def test_forged_offsets_and_unknown_jobs_do_not_break_the_log_or_the_stream(dashboard: Dashboard) -> None:
    d = dashboard
    job = d.cli.submit("--", "sh", "-c", "echo hello")
    d.cli("wait", str(job), timeout=60)
    assert _json(d, f"/api/jobs/{job}/log?offset=-5")["text"] == "hello\n"  # from the start, not a 500
    forged = {"Last-Event-ID": '{"log": -1, "metrics": 1e300}'}
    text = _events(d, f"/api/events?job={job}", forged, '"text": "hello')
    assert "event: log" in text  # read from the start
    alive = _events(d, "/api/events?job=999999", None, "event: status")  # no such job: the stream goes on
    assert "event: status" in alive


def test_hostile_ids_names_and_clients(dashboard: Dashboard) -> None:
    """Ids past what the state holds are a 404 or a 400, never a 500; a group named with
    any characters opens; every response forbids framing and foreign scripts; past the cap
    the oldest event stream is closed; a request whose headers never finish is dropped."""
    import socket
    import time

    huge = str(2**63)
    for path in (f"/api/jobs/{huge}", f"/api/jobs/{huge}/log", f"/api/jobs/{huge}/metrics", "/api/jobs/0"):
        status, _, body = _call(dashboard, path)
        assert status == 404, (path, status, body)
    status, _, _ = _call(dashboard, f"/api/jobs?before={huge}")
    assert status == 400
    status, _, body = _call(
        dashboard, f"/api/jobs/{huge}/cancel", "POST", {"Origin": dashboard.base.rstrip("/")}
    )
    assert status == 404, body
    assert "id: " in _events(dashboard, f"/api/events?job={huge}", None, "event: status")  # the stream lives
    cli = dashboard.cli
    job = cli.submit("--group", "a/b c%?#", "--", "true")
    assert cli("wait", str(job)).returncode == 0
    from urllib.parse import quote

    group = _json(dashboard, f"/api/groups/{quote('a/b c%?#', safe='')}")
    assert group["group"] == "a/b c%?#" and [j["id"] for j in group["jobs"]] == [job]
    _, headers, _ = _call(dashboard, "/")
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "script-src 'self'" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"

    parts = urlsplit(dashboard.base)
    request = (
        f"GET /api/events HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {dashboard.token}\r\n\r\n"
    )
    streams = []
    for _ in range(33):  # the default cap is 32: the first is closed
        s = socket.create_connection((parts.hostname, parts.port), timeout=20)
        s.sendall(request.encode())
        assert b"200" in s.recv(64)
        streams.append(s)
    first = streams[0]
    first.settimeout(20)
    ended, deadline = False, time.monotonic() + 20
    while not ended and time.monotonic() < deadline:
        chunk = first.recv(65536)
        ended = chunk.endswith(b"0\r\n\r\n") or chunk == b""
    assert ended, "the oldest stream was closed"
    for s in streams:
        s.close()

    slow = socket.create_connection((parts.hostname, parts.port), timeout=30)
    slow.sendall(f"GET /api/jobs HTTP/1.1\r\nHost: {parts.netloc}\r\n".encode())  # never finished
    slow.settimeout(30)
    assert slow.recv(1024) == b"", "the half-sent request's connection was closed"
    slow.close()


def test_no_process_has_a_secret_in_its_arguments_and_another_user_gets_nothing_even_with_one(
    dashboard: Dashboard,
    other_user: OtherUser,  # noqa: F811
) -> None:
    """``tandem dashboard`` (as run by default: it opens a browser) puts no login code and no
    token on any command line, the browser's included; another user who got hold of a token
    anyway has their connection closed unread (the dashboard serves its own user's sockets)."""
    d = dashboard
    opened = d.opened.read_text().splitlines()[1:]
    assert opened == [d.login_page.as_uri()], opened  # the browser got a path, nothing secret
    secrets = [d.token, d.code()]
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        assert not any(s in cmdline for s in secrets), (proc.pid, cmdline)
    parts = urlsplit(d.base)
    code = (
        "import http.client, sys\n"
        f"c = http.client.HTTPConnection({parts.hostname!r}, {parts.port}, timeout=10)\n"
        "try:\n"
        f"    c.request('GET', '/api/jobs', headers={{'Authorization': 'Bearer {d.token}'}})\n"
        "    print(c.getresponse().status)\n"
        "except (ConnectionError, http.client.HTTPException) as exc:\n"
        "    print('closed', type(exc).__name__)\n"
    )
    r = other_user.run([other_user.python, "-c", code])
    assert r.returncode == 0 and r.stdout.startswith("closed"), (r.stdout, r.stderr)
    assert _call(d, "/api/jobs")[0] == 200, "the same request from its own user is served"
    login = other_user.run([other_user.python, "-c", code.replace("'GET', '/api/jobs'", "'GET', '/'")])
    assert login.stdout.startswith("closed"), login.stdout  # not even the page
