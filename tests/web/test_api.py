"""The dashboard over a real socket, against a real daemon: who may use it, and its JSON API
(the field names of ``tandem ls --json`` / ``show --json``, paging, logs, no environment)."""

from __future__ import annotations

import http.client
import json
import os
import stat
from urllib.parse import urlsplit

from tandem.web.access import COOKIE
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


def test_access_needs_the_token_a_loopback_host_and_same_origin_writes(dashboard: Dashboard) -> None:
    d = dashboard
    held = d.cli.submit("--after", str(d.cli.submit("--", "sleep", "30")), "--", "true")
    assert _call(d, "/api/jobs", auth=False)[0] == 401
    assert _call(d, "/", auth=False)[0] == 401
    status, headers, _ = _call(d, f"/?token={d.token}", auth=False)
    cookie = headers.get("set-cookie", "")
    assert status == 303 and headers["location"] == "/" and f"{COOKIE}={d.token}" in cookie
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert _call(d, "/api/jobs", auth=False, headers={"Cookie": f"{COOKIE}={d.token}"})[0] == 200
    assert _call(d, "/?token=wrong", auth=False)[0] == 401
    assert _call(d, "/api/jobs", headers={"Host": "attacker.example:80"})[0] == 403  # DNS rebinding
    cross = _call(d, f"/api/jobs/{held}/cancel", "POST", headers={"Origin": "http://attacker.example"})
    assert cross[0] == 403 and d.cli.job(held)["state"] == "queued"
    assert _call(d, f"/api/jobs/{held}/cancel", "POST")[0] == 403  # no Origin at all: refused too
    same = _call(d, f"/api/jobs/{held}/cancel", "POST", headers={"Origin": d.base.rstrip("/")})
    assert same[0] == 200 and json.loads(same[2])["cancelled"] == [held]
    assert d.cli.job(held)["state"] == "cancelled"
    token_file = d.cli.env["TANDEM_RUNTIME_DIR"] + "/dashboard/token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600


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
