"""The group page's text, as a person reads it: never ``null``, ``undefined``, ``NaN`` or a
raw object, whether the group has a data selection or not, and whatever of its numbers are
not known yet.

The page's own scripts (``charts.js``, ``app.js``, as ``index.html`` loads them) run under
Node with a small stand-in for the browser's document that, like the real one, writes a
``null`` handed to ``append`` or ``replaceChildren`` as the text "null" (where Chromium is,
``test_browser`` drives the real thing). Skipped where there is no ``node``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

NODE = shutil.which("node")
STATIC = Path(__file__).resolve().parents[2] / "src" / "tandem" / "web" / "static"
# The page's own scripts (uPlot, in vendor/, is stood in for), in the order index.html loads
# them: they share one global scope.
PAGE = (STATIC / "index.html").read_text()
SCRIPTS = [STATIC / name for name in re.findall(r'<script src="/static/([\w.]+\.js)"', PAGE)]

# The browser's document, as far as the group page uses it: elements, text, fragments.
HARNESS = r"""
const fs = require("fs"); const vm = require("vm");
const [scripts, groupJson] = process.argv.slice(2);
class Node {
  constructor(tag) {
    this.tag = tag; this.childNodes = []; this.attrs = {}; this.dataset = {}; this.style = {};
    this.parent = null;
  }
  _add(kids) {  // the DOM's rule: a node is added, anything else becomes text (null: "null")
    for (const k of kids) {
      const n = k instanceof Node ? k : new Text(String(k));
      const nodes = n.tag === "#fragment" ? n.childNodes.splice(0) : [n];
      for (const c of nodes) { c.parent = this; this.childNodes.push(c); }
    }
  }
  append(...kids) { this._add(kids); }
  replaceChildren(...kids) { this.childNodes = []; this._add(kids); }
  replaceWith(n) {
    this.parent.childNodes[this.parent.childNodes.indexOf(this)] = n; n.parent = this.parent;
  }
  after() {}
  setAttribute(k, v) { this.attrs[k] = v; }
  addEventListener() {}
  get value() {
    const o = this.childNodes.find((c) => c.attrs.selected !== undefined) || this.childNodes[0];
    return o ? o.attrs.value : "";
  }
  get textContent() { return this.childNodes.map((c) => c.textContent).join(" "); }
  set textContent(v) { this.childNodes = [new Text(String(v))]; }
}
class Text extends Node {
  constructor(t) { super("#text"); this.text = t; }
  get textContent() { return this.text; }
}
const byId = {};
const document = {
  getElementById: (id) => byId[id] || (byId[id] = new Node("div")),
  createElement: (t) => new Node(t), createElementNS: (_, t) => new Node(t),
  createTextNode: (t) => new Text(t), createDocumentFragment: () => new Node("#fragment"),
  body: { dataset: {} },
};
const group = JSON.parse(groupJson);
const answers = (path) => path.startsWith("/api/groups/") ? group : { keys: [], series: {}, energy: {} };
// The live stream never answers here (a pending promise keeps nothing alive); a tab logged in.
const fetch = (path) => path.startsWith("/api/events") ? new Promise(() => {})
  : Promise.resolve({ ok: true, status: 200, json: async () => answers(path) });
const sessionStorage = { getItem: () => "a-token", setItem() {}, removeItem() {} };
const context = { document, Node, window: { addEventListener() {} }, location: { hash: "#/group/g" },
  fetch, sessionStorage, history: { replaceState() {} }, AbortController,
  uPlot: class {}, URLSearchParams, setTimeout, clearTimeout, console };
vm.createContext(context);
for (const path of JSON.parse(scripts)) vm.runInContext(fs.readFileSync(path, "utf8"), context);
const wait = () => {
  const failed = byId.view.childNodes.some((c) => c.attrs.id === "error");
  if (!document.body.dataset.ready && !failed) return setTimeout(wait, 10);
  const ready = document.body.dataset.ready || null;
  process.stdout.write(JSON.stringify({ ready, text: byId.view.textContent }));
};
wait();
"""

JOB = {
    "id": 1,
    "name": None,
    "state": "succeeded",
    "placement": None,
    "wait_s": 1.0,
    "run_s": 2.0,
    "group": "g",
    "mlflow_run_id": None,
    "energy": {},
    "command": ["true"],
    "reason": None,
}
UNKNOWN = {
    "selection": None,
    "job_mean": None,
    "full_data": None,
    "saving_per_job": None,
    "break_even_jobs": None,
}
NOTHING_KNOWN = {  # a selection no job has measured yet: every number unknown
    "id": "00112233aabbccdd",
    "share": "picked",
    "method": "random",
    "size": 30,
    "ratio": 0.3,
    "selection_cost": {"wall_s": 30.0},
    "jobs": [],
    "measured_jobs": 0,
    "baseline": "estimated: a job's cost / the selected fraction",
    "break_even": {
        k: UNKNOWN for k in ("wall_s", "cpu_s", "energy_measured_joules", "energy_estimated_joules")
    },
}
DAMAGED = {"id": "ffeeddccbbaa0099", "share": "other", "error": "selection ffeeddccbbaa0099 is damaged"}


def _report(tmp_path: Path) -> dict:
    """The sweep report the server sends for a group whose one job has not run yet (every
    number unknown), made by the real computation."""
    from tandem.place.model import JobSpec
    from tandem.place.state import State
    from tandem.place.sweep_report import group_report

    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    state = State(state_dir)
    state.add_job(JobSpec(["true"], "/tmp", {}, group="g", params={"lr": 0.1}), 0, 0.0)
    report = group_report(state, "g", None, best="val_loss:min")
    state.close()
    return report  # type: ignore[return-value]


def _page_text(tmp_path: Path, selections: list[dict]) -> str:
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)
    group = {"group": "g", "jobs": [JOB], "report": _report(tmp_path), "selections": selections}
    out = subprocess.run(
        [NODE or "node", str(harness), json.dumps([str(s) for s in SCRIPTS]), json.dumps(group)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    page = json.loads(out.stdout)
    assert page["ready"] == "/group/g", page  # drawn whole, not an error
    return page["text"]


@pytest.mark.skipif(NODE is None, reason="no node")
@pytest.mark.parametrize(
    "selections", [[], [NOTHING_KNOWN], [NOTHING_KNOWN, DAMAGED]], ids=["none", "unknown", "damaged"]
)
def test_the_group_page_shows_no_null_undefined_nan_or_object(tmp_path: Path, selections: list[dict]) -> None:
    text = _page_text(tmp_path, selections)
    assert "group g: 1 job(s)" in text
    # The sweep's table and words, as the CLI prints them (its one computation on the server).
    assert "lr=0.1" in text and "1 queued" in text
    assert "best by val_loss (min): no job logged val_loss" in text
    for word in ("null", "undefined", "NaN", "[object"):
        assert word not in text, (word, text)
    if selections:
        assert "data selection" in text and "pays after (time)" in text
    else:
        assert "data selection" not in text  # no selection: no section at all
