// tandem dashboard: its charts (uPlot), the job page's and the group page's. Loaded before
// app.js, whose helpers (el, api, size) these call once the page runs.
"use strict";

// A time axis of at least a minute: one point alone would otherwise span years.
const SPAN = (u, min, max) => (max - min < 60 ? [min - 5, Math.max(max, min) + 55] : [min, max]);

// uPlot gives a lone point a day-wide axis (SPAN is not asked then): a minute instead.
function oneMinute(plot, data) {
  if (data[0].length === 1) plot.setScale("x", { min: data[0][0] - 5, max: data[0][0] + 55 });
}

// A hardware series of the job page: a small chart of one key over time, points added live.
function chart(key, points, width) {
  const box = el("div", { class: "chart", "data-key": key });
  const data = [points.map((p) => p[0]), points.map((p) => p[1])];
  const plot = new uPlot({ title: key.replace("system/", ""), width, height: 180, scales: { x: { time: true, range: SPAN } },
    series: [{}, { label: key.split("/").pop(), stroke: "#0a84ff" }],
    axes: [{}, { size: 70, values: (u, vals) => vals.map((v) => key.endsWith("bytes") ? size(v) : v) }] }, data, box);
  oneMinute(plot, data);
  return { box, plot, data };
}

// --- one metric of several runs on one chart: a group's jobs, a job's attempts --------------
// A chooser of metric keys; setKeys fills it, keeping the key chosen (else `preferred`, else
// the first), and leaves it alone when its keys are the same (an open list stays open).
function keyChooser(id, onchange) { return el("select", { id, onchange }); }
function setKeys(pick, keys, preferred) {
  const keep = pick.value || preferred;
  const chosen = keys.includes(keep) ? keep : keys[0];
  if (pick.dataset.keys === keys.join("\n") && pick.value === (chosen || "")) return;
  pick.dataset.keys = keys.join("\n");
  pick.replaceChildren(...keys.map((k) => el("option", { value: k, selected: k === chosen }, k)));
}

// `key` of each run ({label, path}: its metrics endpoint) in `box`, by "time" or "step", on
// one x axis (uPlot's: one array of x, one of y a run, null where a run has no point).
// The axis is the latest run's (a key whose points all share one step is charted over time,
// the endpoint says); a run on another leaves its series empty. Returns the endpoint's answers.
async function drawRuns(box, key, runs, by, width, height) {
  const per = Math.max(50, Math.floor(2000 / Math.max(1, runs.length)));
  const query = `key=${encodeURIComponent(key)}&points=${per}&by=${by}`;
  const all = await Promise.all(runs.map((r) => api(`${r.path}${r.path.includes("?") ? "&" : "?"}${query}`)));
  const axisOf = (m) => (m.axis || {})[key];
  const axis = all.map(axisOf).filter(Boolean).pop() || by;
  const series = all.map((m) => axisOf(m) === axis ? m.series[key] || [] : []);
  const xs = [...new Set(series.flatMap((s) => s.map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = series.map((s) => { const y = new Array(xs.length).fill(null); s.forEach((p) => { y[index.get(p[0])] = p[1]; }); return y; });
  const lines = [axis === "step" ? { label: "step" } : {}]
    .concat(runs.map((r, i) => ({ label: r.label, stroke: `hsl(${(i * 137) % 360} 70% 45%)`, spanGaps: true })));
  const time = axis === "time";
  box.replaceChildren();
  Object.assign(box.dataset, { key, axis, points: series.reduce((n, s) => n + s.length, 0) });
  const plot = new uPlot({ title: key, width, height, series: lines,
    scales: { x: time ? { time: true, range: SPAN } : { time: false } },
    axes: [time ? {} : { label: "step" }, { size: 60 }] }, [xs, ...ys], box);
  if (time && xs.length) oneMinute(plot, [xs]);
  return all;
}
