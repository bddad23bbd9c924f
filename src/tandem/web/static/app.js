// tandem dashboard: one page, three views (#/ overview, #/job/ID, #/group/NAME), kept live
// by server-sent events (/api/events). Every job row carries data-job-id and data-state.
// Every API request carries this tab's session token (Authorization: Bearer), see login().
"use strict";

const view = document.getElementById("view");
const liveBadge = document.getElementById("live");
const WAITING = new Set(["queued", "retrying"]);
const STATES = ["queued", "running", "retrying", "succeeded", "failed", "oom", "cancelled", "pruned"];
const DEFAULT_KEYS = ["system/process_tree/cpu_percent", "system/process_tree/pss_bytes",
  "system/gpu_0/utilization_percent", "system/gpu_0/run_memory_bytes", "system/host/cpu_percent"];

// --- small helpers ------------------------------------------------------------------------
function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}
// --- logging in: a session token per tab, kept in sessionStorage, sent in a header ----------
// No cookie (a browser sends cookies to every port of the host, another user's server's too).
// The login page `tandem dashboard` opens sends the browser here with #login=CODE, a one-time
// code that is exchanged once for this tab's token, then dropped from the address bar.
const TOKEN_KEY = "tandem-dashboard-token";
let token = sessionStorage.getItem(TOKEN_KEY) || "";
const LOGGED_OUT = "not logged in: open the login page that `tandem dashboard` printed (file://.../login-PORT.html)";
function authHeaders(extra) { return Object.assign({}, extra || {}, token ? { Authorization: `Bearer ${token}` } : {}); }
function loggedOut() { token = ""; sessionStorage.removeItem(TOKEN_KEY); return new Error(LOGGED_OUT); }
async function login() {
  const m = location.hash.match(/^#login=([A-Za-z0-9_-]+)$/);
  if (!m) return;
  history.replaceState(null, "", `${location.pathname}#/`);  // the spent code leaves the address bar and history
  const response = await fetch("/api/login", { method: "POST", credentials: "omit", cache: "no-store",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify({ code: m[1] }) });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok || !body.token) throw new Error(body.error || response.statusText);
  token = body.token; sessionStorage.setItem(TOKEN_KEY, token);
}
async function api(path, options) {
  options = options || {};
  const response = await fetch(path, Object.assign({ credentials: "omit", cache: "no-store" }, options, { headers: authHeaders(options.headers) }));
  if (response.status === 401) throw loggedOut();
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}
function size(bytes) {
  if (bytes === null || bytes === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0; let v = bytes;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(v < 10 && i ? 1 : 0)} ${units[i]}`;
}
function dur(s) {
  if (s === null || s === undefined) return "-";
  s = Math.round(s);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
}
function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "-"; }
function joules(j) { return j === undefined || j === null ? "-" : j >= 3600 ? `${(j / 3600).toFixed(2)} Wh` : `${j.toFixed(1)} J`; }
function stateCell(state) { return el("span", { class: `state state-${state}` }, state); }
// A share group's producer is a job row of role "producer": a badge says so.
function roleBadge(job) { return job.role === "producer" ? el("span", { class: "badge role" }, " producer") : ""; }
function jobLink(job) { return el("span", {}, el("a", { href: `#/job/${job.id}` }, job.name ? `${job.id} ${job.name}` : String(job.id)), roleBadge(job)); }

// --- the live stream ----------------------------------------------------------------------
let stream = null;
const handlers = {};
function badge(state) { liveBadge.dataset.live = state; liveBadge.textContent = state; }
function dispatch(block, cursor) {
  // One server-sent event: "id: ...", "event: KIND", "data: JSON" lines (": ..." a keep-alive).
  let kind = "message"; const data = [];
  for (const line of block.split("\n")) {
    const [field, ...rest] = line.split(":"); const value = rest.join(":").replace(/^ /, "");
    if (field === "id") cursor.id = value;
    else if (field === "event") kind = value;
    else if (field === "data") data.push(value);
  }
  if (data.length && handlers[kind]) handlers[kind](JSON.parse(data.join("\n")));
}
function connect(params) {
  // EventSource cannot send the token's header: the stream is read with fetch, and resumed
  // from the last event's id (Last-Event-ID) when it drops, as EventSource would.
  if (stream) stream.abort();
  const control = stream = new AbortController();
  const cursor = { id: "" };
  badge("connecting");
  (async () => {
    while (!control.signal.aborted) {
      try {
        const headers = authHeaders(cursor.id ? { "Last-Event-ID": cursor.id } : {});
        const response = await fetch(`/api/events?${new URLSearchParams(params)}`, { headers, credentials: "omit", cache: "no-store", signal: control.signal });
        if (response.status === 401) { loggedOut(); badge("logged out"); return; }
        if (!response.ok) throw new Error(response.statusText);
        badge("live");
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n?/g, "\n");
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) { dispatch(buffer.slice(0, end), cursor); buffer = buffer.slice(end + 2); }
        }
      } catch (e) {
        if (control.signal.aborted) return;
      }
      badge("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  })();
}
function setHandlers(h) { for (const k of Object.keys(handlers)) delete handlers[k]; Object.assign(handlers, h); }

// --- overview -----------------------------------------------------------------------------
function countsBox(counts) {
  return el("div", { class: "counts", id: "counts" },
    STATES.map((s) => el("div", { class: "count", "data-count": s }, el("b", { class: `state-${s}` }, counts[s] || 0), s)));
}
function cards(status, whyNot) {
  if (!status) return el("div", { class: "cards", id: "cards" }, el("div", { class: "card dim" }, `no daemon: ${whyNot || "none answers"}`));
  const cap = status.capacity; const used = status.used; const total = cap.total; const held = used.reserved;
  const busy = used.measured_free ? (total.cores - used.measured_free.cores).toFixed(1) : "-";
  const host = el("div", { class: "card", "data-card": "host" }, el("h3", {}, "host"),
    `cores ${held.cores.toFixed(1)} / ${total.cores} reserved`, el("div", { class: "bar" }, el("i", { style: `width:${100 * held.cores / total.cores}%` })),
    `RAM ${size(held.ram)} / ${size(total.ram)} reserved`, el("div", { class: "bar" }, el("i", { style: `width:${100 * held.ram / total.ram}%` })),
    el("div", { class: "dim" }, `busy ${busy} cores · ${used.jobs} running · ${status.policy}`));
  const gpus = cap.gpus.map((g, i) => {
    const u = used.gpus[i] || {};
    return el("div", { class: "card", "data-card": `gpu-${g.index}` }, el("h3", {}, `GPU ${g.index}`),
      `memory ${size(u.mem_reserved_bytes)} reserved, ${size(u.mem_used_bytes)} used / ${size(g.mem_bytes)}`,
      el("div", { class: "bar" }, el("i", { style: `width:${100 * (u.mem_reserved_bytes || 0) / g.mem_bytes}%` }),
        el("i", { class: "m", style: `width:${100 * (u.mem_used_bytes || 0) / g.mem_bytes}%` })),
      el("div", { class: "dim" }, `activity ${u.activity_mean === null || u.activity_mean === undefined ? "-" : Math.round(100 * u.activity_mean) + "%"} · ${u.jobs || 0} job(s)${u.probing ? " · probing" : ""}`));
  });
  // On a Ray cluster: a card per node (alive or gone), what its attempts reserve on it against what it has.
  const nodes = (status.nodes || []).map((n) => n.alive
    ? el("div", { class: "card", "data-card": `node-${n.name}` }, el("h3", {}, `node ${n.name}`),
      `cores ${n.reserved.cores.toFixed(1)} / ${n.total.cores} reserved (${n.cpus_held.toFixed(1)} held in Ray)`,
      el("div", { class: "bar" }, el("i", { style: `width:${100 * Math.min(1, n.reserved.cores / (n.total.cores || 1))}%` })),
      `RAM ${size(n.reserved.ram)} / ${size(n.total.ram)} reserved`,
      el("div", { class: "bar" }, el("i", { style: `width:${100 * n.reserved.ram / (n.total.ram || 1)}%` })),
      el("div", { class: "dim" }, `${n.measured_free ? `busy ${(n.total.cores - n.measured_free.cores).toFixed(1)} cores · ${size(n.measured_free.ram)} free` : "not measured"} · ${n.jobs} running${n.gpus.length ? ` · GPUs ${n.gpus.join(", ")}` : ""}`))
    : el("div", { class: "card dim", "data-card": `node-${n.name}` }, el("h3", {}, `node ${n.name}`), "gone: its jobs run elsewhere"));
  return el("div", { class: "cards", id: "cards" }, host, nodes, gpus);
}
function timelineSvg(data, gpuCount) {
  const now = data.now; const attempts = data.attempts;
  const first = Math.min(now, ...attempts.map((a) => a.started));
  const t0 = Math.max(now - 3600, Math.min(now - 120, first - 0.05 * (now - first)));
  // GPUs: the daemon's, or (with no daemon) as many as the attempts name.
  gpuCount = Math.max(gpuCount, ...attempts.flatMap((a) => a.gpus.map((g) => g + 1)), 0);
  const lanes = ["host"].concat(Array.from({ length: gpuCount }, (_, i) => `GPU ${i}`));
  const W = 1000; const lane = 22; const left = 60; const H = lane * lanes.length + 20;
  const x = (t) => left + (W - left - 10) * (t - t0) / Math.max(1, now - t0);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`); svg.setAttribute("class", "timeline"); svg.setAttribute("id", "timeline");
  const add = (tag, attrs, text) => {
    const n = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    svg.append(n); return n;
  };
  lanes.forEach((name, i) => add("text", { x: 4, y: lane * i + 15 }, name));
  add("text", { x: left, y: H - 4 }, when(t0)); add("text", { x: W - 70, y: H - 4 }, when(now));
  for (const a of attempts) {
    const rows = a.gpus.length ? a.gpus.map((g) => g + 1) : [0];
    for (const row of rows) {
      const r = add("rect", { x: x(a.started), y: lane * row + 3, width: Math.max(2, x(a.ended || now) - x(a.started)), height: lane - 6,
        rx: 2, fill: `var(--${a.state === "lost" ? "cancelled" : a.state})`, opacity: 0.8,
        "data-job-id": a.job_id });
      const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
      title.textContent = `job ${a.job_id} attempt ${a.n}: ${when(a.started)}-${a.ended ? when(a.ended) : "now"}, GPU memory ${size(a.gpu_mem_bytes)} reserved, peak ${size(a.peak_gpu_mem_bytes)}`;
      r.append(title);
    }
  }
  return svg;
}
function jobsTable(jobs, columns, id) {
  const head = el("tr", {}, columns.map((c) => el("th", {}, c[0])));
  const rows = jobs.map((j) => el("tr", { "data-job-id": j.id, "data-state": j.state }, columns.map((c) => el("td", { class: c[2] || null }, c[1](j)))));
  return el("table", { id }, el("thead", {}, head), el("tbody", {}, rows));
}
const JOB_COLUMNS = [
  ["job", jobLink], ["state", (j) => stateCell(j.state)],
  ["where", (j) => j.placement ? (j.placement.gpus.length ? `GPU ${j.placement.gpus.join(",")}` : "cpu") : "-"],
  ["wait", (j) => dur(j.wait_s)], ["run", (j) => dur(j.run_s)],
  ["group", (j) => j.group ? el("a", { href: `#/group/${encodeURIComponent(j.group)}` }, j.group) : ""],
  ["why / how it ended", (j) => j.reason || j.cause_line || j.cause || ""],
  ["command", (j) => j.command.join(" "), "cmd"],
];
// A system manager's page: whose each job is (others' come without what they run), and the
// host's users by fair share (the least recent use first: whose job goes next).
const USER_COLUMN = ["user", (j) => j.user || "-"];
function withUsers(columns, status) { return status && status.users && status.users.length ? [columns[0], USER_COLUMN, ...columns.slice(1)] : columns; }
function usersBox(status) {
  if (!status || !status.users || !status.users.length) return el("div", { id: "users" });
  const head = el("tr", {}, ["user", "running", "waiting", "cores held", "GPU memory held", "recent use"].map((c) => el("th", {}, c)));
  const rows = status.users.map((u) => el("tr", { "data-user": u.name }, el("td", {}, u.name), el("td", {}, u.running), el("td", {}, u.waiting),
    el("td", {}, u.cores.toFixed(1)), el("td", {}, size(u.gpu_mem || null)), el("td", {}, `${dur(u.use)} of the host`)));
  return el("div", { id: "users" }, el("h2", {}, "users, by fair share (the first goes next)"), el("table", { id: "users-table" }, el("thead", {}, head), el("tbody", {}, rows)));
}
const QUEUE_COLUMNS = [["job", jobLink], ["state", (j) => stateCell(j.state)], ["waits for", (j) => j.reason || "-"],
  ["cores", (j) => j.request.cpus], ["RAM", (j) => size(j.request.mem_bytes || null)], ["command", (j) => j.command.join(" "), "cmd"]];

async function overview() {
  const filter = new URLSearchParams(location.hash.split("?")[1] || "").get("state") || "";
  const since = Date.now() / 1000 - 1;
  const [page, queue, gpus, timeline, shares] = await Promise.all([
    api(`/api/jobs?limit=100${filter ? `&state=${filter}` : ""}`), api("/api/queue"), api("/api/gpus"), api("/api/timeline"), api("/api/shares")]);
  const jobs = new Map(page.jobs.map((j) => [j.id, j]));
  const waiting = new Map(queue.jobs.map((j) => [j.id, j]));
  let counts = gpus.counts; let status = gpus.daemon; let older = page.next_before;
  const sections = {};
  const render = () => {
    const sorted = [...jobs.values()].sort((a, b) => b.id - a.id);
    const q = [...waiting.values()].sort((a, b) => a.id - b.id);
    sections.counts.replaceWith(sections.counts = countsBox(counts));
    sections.queueHead.textContent = `queue (${counts.queued || 0} queued, ${counts.retrying || 0} retrying)`;
    sections.queue.replaceWith(sections.queue = q.length ? jobsTable(q, withUsers(QUEUE_COLUMNS, status), "queue") : el("p", { id: "queue", class: "dim" }, "nobody waits"));
    sections.jobs.replaceWith(sections.jobs = jobsTable(sorted, withUsers(JOB_COLUMNS, status), "jobs"));
  };
  const select = el("select", { id: "state-filter", onchange: (e) => { location.hash = e.target.value ? `#/?state=${e.target.value}` : "#/"; } },
    el("option", { value: "" }, "all states"), STATES.map((s) => el("option", { value: s, selected: s === filter }, s)));
  const more = el("button", { id: "older", onclick: async () => {
    if (!older) return;
    const next = await api(`/api/jobs?limit=100&before=${older}${filter ? `&state=${filter}` : ""}`);
    next.jobs.forEach((j) => jobs.set(j.id, j)); older = next.next_before; more.disabled = !older; render();
  } }, "older jobs");
  more.disabled = !older;
  sections.counts = el("div"); sections.queue = el("div"); sections.jobs = el("div"); sections.queueHead = el("h2", { id: "queue-head" });
  sections.cards = cards(status, gpus.why_not);
  sections.users = usersBox(status);
  sections.timeline = timelineSvg(timeline, status ? status.capacity.gpus.length : 0);
  const shareRows = shares.shares.map((s) => el("tr", { "data-share": s.name }, el("td", {}, s.name), el("td", {}, `${s.source} ${s.ref}`),
    el("td", {}, s.outside_pid ? `served by a producer outside the manager (pid ${s.outside_pid})`
      : s.producer_pid ? `pid ${s.producer_pid}, ${s.cpus} cores` : s.error ? el("span", { class: "error" }, s.error) : "not running"),
    el("td", {}, s.jobs.length), el("td", {}, s.live ? `${s.live.batches_per_s.toFixed(1)} batches/s, blocked ${s.live.blocked_s.toFixed(1)} s, ${s.live.consumers.length} consumer(s)` : "-")));
  view.replaceChildren(
    sections.counts, el("h2", {}, "machine"), sections.cards, sections.users,
    el("h2", {}, "timeline (up to the last hour)"), sections.timeline,
    sections.queueHead, sections.queue,
    el("h2", {}, "jobs"), el("div", { class: "toolbar" }, select, more), sections.jobs,
    el("h2", {}, "share groups"), shares.shares.length ? el("table", { id: "shares" }, el("tr", {}, ["name", "data", "producer", "jobs", "now"].map((c) => el("th", {}, c))), shareRows) : el("p", { class: "dim" }, "none defined"));
  render();
  let refresh = null;
  setHandlers({
    jobs: (d) => {
      counts = d.counts;
      for (const j of d.jobs) {
        if (!filter || j.state === filter) jobs.set(j.id, j); else jobs.delete(j.id);
        if (WAITING.has(j.state)) waiting.set(j.id, j); else waiting.delete(j.id);
      }
      render();
      if (!refresh) refresh = setTimeout(async () => { refresh = null; const t = await api("/api/timeline"); sections.timeline.replaceWith(sections.timeline = timelineSvg(t, status ? status.capacity.gpus.length : 0)); }, 1000);
    },
    status: (d) => {
      status = d.daemon; sections.cards.replaceWith(sections.cards = cards(status, d.why_not));
      sections.users.replaceWith(sections.users = usersBox(status));
    },
  });
  connect({ since });
}

// --- one job --------------------------------------------------------------------------------
// What the job logged itself (loss, accuracy: its run's keys outside system/ and summary/), by
// step, a line per attempt's run: the group page's chart (a line per job), kept live.
function loggedMetrics(id, job, keys) {
  const none = el("p", { class: "dim" }, "no metrics logged by the job yet");
  const box = el("div", { id: "logged-chart" });
  const pick = keyChooser("logged-metric", () => draw());
  const node = el("div", { id: "logged" }, el("div", { class: "toolbar" }, pick), box);
  const runsOf = (j) => j.attempts.filter((a) => a.mlflow_run_id)
    .map((a) => ({ label: `attempt ${a.n}`, path: `/api/jobs/${id}/metrics?attempt=${a.n}`, run: a.mlflow_run_id }));
  let runs = runsOf(job); let known = []; let busy = false; let again = false; let pending = null;
  const learn = (more) => {
    known = [...new Set(known.concat(more))].sort();
    setKeys(pick, known, known.find((k) => k.includes("loss")));
  };
  const draw = async () => {
    if (busy) { again = true; return; }
    busy = true;
    try {
      pick.hidden = !pick.value;
      if (!pick.value || !runs.length) box.replaceChildren(none);
      else learn((await drawRuns(box, pick.value, runs, "step", 900, 260)).flatMap((m) => m.logged_keys || []));
    } catch (e) {
      box.replaceChildren(el("p", { class: "error" }, e.message));
    } finally {
      busy = false;
      if (again) { again = false; draw(); }
    }
  };
  const later = () => { if (!pending) pending = setTimeout(() => { pending = null; draw(); }, 1000); };
  const start = async () => {
    // The latest run's keys came with the page's metrics; an earlier attempt's are asked once.
    const earlier = await Promise.all(runs.slice(0, -1).map((r) => api(`${r.path}&points=1`)));
    learn(keys.concat(...earlier.map((m) => m.logged_keys)));
    await draw();
  };
  return {
    node, start,
    job: (j) => { const now = runsOf(j); if (now.map((r) => r.run).join() !== runs.map((r) => r.run).join()) { runs = now; later(); } },
    logged: (more) => { learn(more); later(); },
  };
}
async function jobPage(id) {
  const since = Date.now() / 1000 - 1;
  const [job, log, metrics] = await Promise.all([api(`/api/jobs/${id}`), api(`/api/jobs/${id}/log`), api(`/api/jobs/${id}/metrics?points=600`)]);
  const header = el("div");
  const logBox = el("pre", { class: "log", id: "log" }, log.text);
  const charts = el("div", { class: "charts", id: "charts" });
  const energy = el("dl", { id: "energy" });
  const shown = {};
  let current = job;  // as the last jobs event has it (its run is recorded once it is made)
  const renderMetrics = (m) => {
    energy.replaceChildren(el("dt", {}, "measured"), el("dd", {}, joules(m.energy.measured_joules)), el("dt", {}, "estimated"), el("dd", {}, joules(m.energy.estimated_joules)));
    for (const [key, points] of Object.entries(m.series)) {
      if (!DEFAULT_KEYS.includes(key) && !key.includes("energy")) continue;
      if (!shown[key]) {
        if (!Object.keys(shown).length) charts.replaceChildren();  // the "no metrics yet" line
        shown[key] = chart(key, points, 440); charts.append(shown[key].box); continue;
      }
      const c = shown[key]; points.forEach((p) => { c.data[0].push(p[0]); c.data[1].push(p[1]); });
      c.plot.setData(c.data); oneMinute(c.plot, c.data);
    }
    if (!Object.keys(shown).length) charts.replaceChildren(el("p", { class: "dim" }, current.mlflow_run_id ? "no metrics yet" : "no MLflow run (yet)"));
  };
  const renderJob = (j) => {
    current = j;
    const cancel = el("button", { class: "danger", id: "cancel", disabled: !(WAITING.has(j.state) || j.state === "running"), onclick: async () => {
      cancel.disabled = true;
      try { await api(`/api/jobs/${id}/cancel`, { method: "POST" }); } catch (e) { cancel.after(el("span", { class: "error" }, ` ${e.message}`)); }
    } }, "Cancel");
    const r = j.request;
    header.replaceChildren(
      el("h2", { "data-job-id": j.id, "data-state": j.state, id: "job-head" }, `job ${j.id}${j.name ? ` ${j.name}` : ""} `, roleBadge(j), " ", stateCell(j.state), " ", cancel),
      el("dl", {}, el("dt", {}, "command"), el("dd", { class: "cmd" }, j.command.join(" ")),
        el("dt", {}, "request"), el("dd", {}, `${r.cpus === "auto" ? `cores auto${j.reservation && j.reservation.cpus !== null ? ` (${j.reservation.cpus}: ${j.reservation.from})` : ""}` : `${r.cpus} cores`}, RAM ${size(r.mem_bytes || null)}, GPUs ${r.gpus === null ? "auto" : r.gpus}, GPU memory ${r.gpu_mem_bytes === null ? "auto" : size(r.gpu_mem_bytes)}`),
        el("dt", {}, "placement"), el("dd", {}, j.placement ? `${j.placement.node ? j.placement.node + "/" : ""}${j.placement.device}${j.placement.gpus.length ? ` GPU ${j.placement.gpus.join(",")}` : ""}` : "-"),
        el("dt", {}, "why it waits"), el("dd", {}, j.reason || "-"),
        el("dt", {}, "how it ended"), el("dd", {}, j.cause ? `${j.cause}${j.cause_line ? `: ${j.cause_line}` : ""}` : "-"),
        el("dt", {}, "group"), el("dd", {}, j.group ? el("a", { href: `#/group/${encodeURIComponent(j.group)}` }, j.group) : "-"),
        el("dt", {}, "parameters"), el("dd", { id: "job-params" }, Object.keys(j.params || {}).length ? Object.entries(j.params).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join("  ") : "-"),
        el("dt", {}, "times"), el("dd", {}, `submitted ${when(j.submitted)}, waited ${dur(j.wait_s)}, ran ${dur(j.run_s)}`),
        el("dt", {}, "peaks"), el("dd", {}, `RAM ${size(j.peak_mem_bytes)}, GPU memory ${size(j.peak_gpu_mem_bytes)}`)),
      el("h2", {}, "attempts"),
      j.attempts.length ? el("table", { id: "attempts" }, el("tr", {}, ["#", "state", "where", "started", "ended", "exit", "cause"].map((c) => el("th", {}, c))),
        j.attempts.map((a) => el("tr", {}, el("td", {}, a.n), el("td", {}, stateCell(a.state)), el("td", {}, (a.placement.node ? a.placement.node + "/" : "") + a.placement.device + (a.placement.gpus.length ? ` GPU ${a.placement.gpus}` : "")),
          el("td", {}, when(a.started)), el("td", {}, when(a.ended)), el("td", {}, a.exit_code === null ? (a.signal || "-") : a.exit_code),
          el("td", {}, a.cause_line || a.cause || "")))) : el("p", { class: "dim" }, "not started yet"));
  };
  renderJob(job);
  const logged = loggedMetrics(id, job, metrics.logged_keys);
  view.replaceChildren(header, el("h2", {}, "metrics the job logged"), logged.node, el("h2", {}, "energy"), energy,
    el("h2", {}, "hardware"), charts, el("h2", {}, "log"), logBox);
  renderMetrics(metrics);
  await logged.start();
  logBox.scrollTop = logBox.scrollHeight;
  let lastMs = 0;
  for (const points of Object.values(metrics.series)) if (points.length) lastMs = Math.max(lastMs, Math.round(points[points.length - 1][0] * 1000));
  setHandlers({
    jobs: (d) => { const j = d.jobs.find((x) => x.id === id); if (j) { renderJob(j); logged.job(j); } },
    log: (d) => { const atEnd = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 4; logBox.append(d.text); if (atEnd) logBox.scrollTop = logBox.scrollHeight; },
    metrics: async (d) => {
      if (d.logged_keys.length) logged.logged(d.logged_keys);
      const m = await api(`/api/jobs/${id}/metrics?points=1`); renderMetrics({ series: d.series, energy: m.energy });
    },
  });
  connect({ since, job: id, log_offset: log.offset, metrics_after: lastMs });
}

// --- a group (a sweep) ----------------------------------------------------------------------
async function groupPage(name) {
  const since = Date.now() / 1000 - 1;
  const data = await api(`/api/groups/${encodeURIComponent(name)}`);
  const runs = data.jobs.filter((j) => j.mlflow_run_id);
  let keys = [];
  if (runs.length) keys = (await api(`/api/jobs/${runs[0].id}/metrics?points=1`)).keys;
  const pick = keyChooser("metric", () => draw());
  setKeys(pick, keys, "system/process_tree/cpu_percent");
  const plotBox = el("div", { id: "group-chart" });
  const lines = runs.map((j) => ({ label: `job ${j.id}`, path: `/api/jobs/${j.id}/metrics` }));
  const draw = async () => { if (pick.value) await drawRuns(plotBox, pick.value, lines, "time", 900, 260); };
  view.replaceChildren(el("h2", {}, `group ${name}: ${data.jobs.length} job(s)`),
    data.report ? sweepTable(data.report) : el("p", { class: "dim", id: "sweep" }, "its sweep's table: tandem report group:NAME on the command line"),
    selectionsTable(data.selections),
    el("h2", {}, "metrics over time"), el("div", { class: "toolbar" }, pick), plotBox);
  await draw();
  let pending = null;
  setHandlers({ jobs: (d) => { if (d.jobs.some((j) => j.group === name) && !pending) pending = setTimeout(() => { pending = null; route(); }, 1000); } });
  connect({ since });
}

// A sweep's report, as `tandem report group:NAME` prints it (the same numbers and words, from
// one computation on the server): a row per job, its producers, the totals, what sharing saved.
function sweepTable(r) {
  if (!r) return el("p", { class: "dim" }, "no jobs");
  const num = (v) => typeof v === "number" && Number.isFinite(v) ? v.toFixed(1) : "-";
  const energy = (m, e) => [m == null ? null : joules(m), e == null ? null : `~${joules(e)} est.`].filter(Boolean).join(" / ") || "-";
  const value = (v) => typeof v === "string" ? v : JSON.stringify(v);
  const params = (p) => Object.entries(p || {}).map(([k, v]) => `${k}=${value(v)}`).join(" ") || "-";
  const metric = (v) => typeof v === "number" && Number.isFinite(v) ? String(Number(v.toPrecision(4))) : "-";
  const keys = r.metric_keys || [];
  const head = el("tr", {}, ["job", "state", "params", "run", "CPU-s", "energy (measured / estimated)", ...keys].map((c) => el("th", {}, c)));
  const rows = r.jobs.map((j) => el("tr", { "data-job-id": j.id, "data-state": j.state },
    el("td", {}, jobLink(j)), el("td", {}, stateCell(j.state)), el("td", {}, params(j.params)), el("td", {}, dur(j.run_s)),
    el("td", {}, num(j.cpu_s)), el("td", {}, energy(j.energy_measured_joules, j.energy_estimated_joules)),
    keys.map((k) => el("td", {}, metric(j.metrics[k])))));
  const producers = r.producers.map((p) => el("tr", { class: "producer" },
    el("td", {}, `producer ${p.share}`), el("td", {}, `fed ${p.group_jobs} of ${p.fed_jobs} job(s) here`), el("td", {}, ""),
    el("td", {}, dur(p.run_s)), el("td", {}, num(p.charged.cpu_s)),
    el("td", {}, energy(p.charged.energy_measured_joules, p.charged.energy_estimated_joules)), keys.map(() => el("td", {}, ""))));
  const t = r.totals;
  const total = el("tr", { class: "total" }, el("td", {}, "total"),
    el("td", {}, Object.entries(t.states).map(([s, n]) => `${n} ${s}`).join(", ")),
    el("td", {}, r.producers.length ? "run s summed; CPU-s jobs + producers" : "run s summed"), el("td", {}, dur(t.jobs_run_s)), el("td", {}, num(t.cpu_s)),
    el("td", {}, energy(t.energy_measured_joules, t.energy_estimated_joules)), keys.map(() => el("td", {}, "")));
  return el("div", { id: "sweep" }, el("table", { id: "jobs" }, el("thead", {}, head), el("tbody", {}, rows, producers, total)),
    (r.said || []).map((line) => el("p", { class: "said" }, line)));
}

// A group's data selections: what each cost, and after how many jobs it pays for itself.
// Its numbers are the selection's (every job that trained on it, of any group), as
// `tandem select report` gives them. None: an empty fragment, which adds nothing to the page
// (a null handed to replaceChildren would show as the text "null").
function selectionsTable(selections) {
  if (!selections || !selections.length) return document.createDocumentFragment();
  const num = (v) => typeof v === "number" && Number.isFinite(v);
  const even = (row) => {
    const v = row ? row.break_even_jobs : null;
    return typeof v === "string" ? v : num(v) ? `${v.toFixed(1)} jobs` : "-";
  };
  // Energy: measured where it was, else estimated (said so); the two are never added.
  const energy = (b) => {
    if (b.energy_measured_joules && b.energy_measured_joules.break_even_jobs != null) return even(b.energy_measured_joules);
    const v = even(b.energy_estimated_joules);
    return v === "-" ? v : `${v} (estimated)`;
  };
  const cost = (c) => `${dur(c.wall_s)}, ${num(c.cpu_s) ? c.cpu_s.toFixed(1) : "-"} CPU-s`;
  const jobs = (s) => `${(s.jobs || []).length}${num(s.measured_jobs) ? ` (${s.measured_jobs} measured)` : ""}`;
  const rows = selections.map((s) => s.error ? el("tr", {}, el("td", {}, s.id), el("td", { colspan: 5, class: "error" }, s.error)) :
    el("tr", { "data-selection": s.id }, el("td", {}, `${s.id} (${s.method}, ${num(s.ratio) ? Math.round(100 * s.ratio) + "%" : "-"})`),
      el("td", {}, cost(s.selection_cost || {})),
      el("td", {}, jobs(s)), el("td", {}, s.baseline || "-"),
      el("td", {}, even((s.break_even || {}).wall_s)), el("td", {}, energy(s.break_even || {}))));
  return el("div", { id: "selections" }, el("h2", {}, "data selection"),
    el("table", {}, el("tr", {}, ["selection", "cost", "jobs (all groups)", "baseline", "pays after (time)", "pays after (energy)"].map((c) => el("th", {}, c))), rows));
}

// --- routing --------------------------------------------------------------------------------
async function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const path = hash.split("?")[0];
  try {
    let m;
    if ((m = path.match(/^\/job\/(\d+)$/))) await jobPage(Number(m[1]));
    else if ((m = path.match(/^\/group\/(.+)$/))) await groupPage(decodeURIComponent(m[1]));
    else await overview();
    document.body.dataset.ready = path;
  } catch (e) {
    view.replaceChildren(el("p", { class: "error", id: "error" }, e.message));
  }
}
window.addEventListener("hashchange", () => { if (!location.hash.startsWith("#login=")) route(); });
login().then(route, (e) => { view.replaceChildren(el("p", { class: "error", id: "error" }, e.message)); });
