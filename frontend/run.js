// One run, live: charts that append as points are committed, alerts, heatmap, config, errors.
"use strict";

const RUN_ID = Number(location.pathname.split("/").pop());
const $ = (id) => document.getElementById(id);
const S = { run: null, keys: [], series: {}, alerts: [], loading: true, buffer: [], dirty: {}, t0: 0 };
const MAX_POINTS = 4000;
const HEAT = new LiveHeatmap($("heatmap"), RUN_ID, "grad");

const isLoss = (k) => k.split("/").pop().toLowerCase().includes("loss");
const WATCH_HINT = (what) => `No ${what} yet. run.watch(model, optimizer) records it at every optimizer step.`;
const CHARTS = {
  loss: { keys: (ks) => ks.filter(isLoss), smoothing: () => Number($("smoothing").value), log: () => $("loss-log").checked,
    empty: "No loss logged yet: run.log({\"loss\": loss})." },
  gnorm: { keys: (ks) => ks.filter((k) => k === "grad/global_norm"), log: () => $("gnorm-log").checked, empty: WATCH_HINT("gradient norm") },
  lr: { keys: (ks) => ks.filter((k) => k === "lr" || k.startsWith("lr/")), log: () => $("lr-log").checked, empty: WATCH_HINT("learning rate") },
  memory: { keys: (ks) => ks.filter((k) => k.startsWith("memory/cuda_") || k === "memory/rss"), bytes: true, log: () => $("memory-log").checked, empty: WATCH_HINT("memory") },
  other: { keys: () => ($("other-key").value ? [$("other-key").value] : []), log: () => $("other-log").checked, empty: "No metrics logged yet." },
};
for (const [name, c] of Object.entries(CHARTS)) {
  c.chart = new LiveChart($("chart-" + name), Object.assign({ t0: () => S.t0, redraw: () => c.chart.render(entriesFor(c), xMode()) }, c));
}

const xMode = () => $("x-mode").value;
const entriesFor = (c) => c.keys(S.keys).filter((k) => S.series[k]).map((k) => ({ label: k, series: S.series[k] }));

async function fetchSeries(key) {
  const s = await GW.getJSON(`/api/runs/${RUN_ID}/series?key=${encodeURIComponent(key)}&max_points=${MAX_POINTS}`);
  return { steps: s.steps, values: s.values.map(GW.num), walls: s.wall_times };
}

async function load() {
  S.loading = true; S.buffer = [];
  try {
    const [run, keys, alerts] = await Promise.all([GW.getJSON(`/api/runs/${RUN_ID}`), GW.getJSON(`/api/runs/${RUN_ID}/keys`), GW.getJSON(`/api/runs/${RUN_ID}/alerts`)]);
    S.run = run; S.keys = keys; S.alerts = alerts; S.t0 = (run.meta && run.meta.start_time) || run.created_at;  // the client clock, like the points
    renderOtherKeys();
    const wanted = new Set(Object.values(CHARTS).flatMap((c) => c.keys(keys)));
    const fetched = await Promise.all([...wanted].map(async (k) => [k, await fetchSeries(k)]));
    S.series = Object.fromEntries(fetched);
  } catch (e) {
    $("alerts").replaceChildren(GW.el("div", { class: "alert critical" }, "Could not load run: " + e.message));
    return;
  } finally { S.loading = false; }
  renderHeader(); renderAlerts(); renderError(); renderConfig(); renderOtherKeys(); renderAll(); if (!HEAT.zoomed) HEAT.load();
  for (const msg of S.buffer) onLive(msg);
  S.buffer = [];
}

function renderAll() {
  for (const c of Object.values(CHARTS)) c.chart.render(entriesFor(c), xMode());
  renderAlertLines(); renderMemoryBreakdown();
  attachAll();
}

function renderHeader() {
  const r = S.run;
  document.title = "gradwatch - " + r.name;
  $("run-name").textContent = r.name; $("run-project").textContent = r.project;
  $("run-status").textContent = r.status; $("run-status").className = "status " + r.status;
  $("run-step").textContent = r.last_step === null ? "" : "step " + r.last_step;
}

function renderAlerts() {
  $("alerts").replaceChildren(...S.alerts.slice(-20).reverse().map((a) => GW.el("div", { class: "alert " + a.severity, "data-kind": a.kind },
    GW.el("b", {}, a.kind), GW.el("span", { class: "muted" }, "step " + (a.step ?? "?") + (a.layer ? " · " + a.layer : "") + " · "), a.message,
    a.step === null || a.step === undefined ? null : GW.el("button", { class: "zoom-to", title: "zoom every chart to this step", onclick: () => zoomTo(a.step) }, "Show step " + a.step))));
  renderAlertLines();
}

// Diagnose an alert: every chart and the heatmap zoom to the steps around it, at full detail.
async function zoomTo(step) {
  if (xMode() !== "step") { $("x-mode").value = "step"; renderAll(); }
  const lo = Math.max(0, step - 50), hi = step + 50;
  for (const c of Object.values(CHARTS)) if (c.chart.drawn) Plotly.relayout(c.chart.div, { "xaxis.range": [lo, hi] });
  if (HEAT.loaded) { HEAT.zoomed = [lo, hi]; HEAT.load(HEAT.zoomed); }
  $("chart-loss").scrollIntoView({ behavior: "smooth", block: "start" });
}

function alertX(step) {
  if (xMode() === "step") return step;
  const s = S.series["grad/global_norm"] || Object.values(S.series)[0];
  if (!s || !s.steps.length) return null;
  let i = s.steps.findIndex((x) => x >= step); if (i < 0) i = s.steps.length - 1;
  return xMode() === "wall" ? new Date(s.walls[i] * 1000) : s.walls[i] - S.t0;
}

function renderAlertLines() {
  const xs = S.alerts.filter((a) => a.step !== null).map((a) => alertX(a.step)).filter((x) => x !== null);
  for (const c of Object.values(CHARTS)) c.chart.setAlertLines(xs);
}

function renderError() {
  const err = S.run.error, box = $("error");
  if (!err) { box.hidden = true; return; }
  box.hidden = false;
  box.replaceChildren(GW.el("h3", {}, "The training script failed: " + err.exc_type),
    GW.el("p", {}, err.message),
    err.diagnosis ? GW.el("p", {}, GW.el("b", {}, err.diagnosis.title + ". "), err.diagnosis.advice) : null,
    GW.el("pre", {}, err.traceback || ""));
}

function kv(dl, obj) {
  dl.replaceChildren(...Object.entries(obj).flatMap(([k, v]) => [GW.el("dt", {}, k), GW.el("dd", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v))]));
}
function renderConfig() {
  kv($("config"), S.run.config || {});
  const m = S.run.meta || {};
  kv($("meta"), { id: S.run.id, started: GW.fmtTime(S.run.created_at), host: m.host, pid: m.pid, device: m.device,
    python: m.python, torch: m.torch, git: m.git_commit, command: (m.command || []).join(" "), tags: (S.run.tags || []).join(", "), notes: S.run.notes });
}

function renderOtherKeys() {
  const sel = $("other-key"), current = sel.value;
  sel.replaceChildren(...S.keys.map((k) => GW.el("option", { value: k }, k)));
  const preferred = S.keys.find((k) => !isLoss(k) && !k.startsWith("memory/") && !k.startsWith("lr") && !k.startsWith("grad/")) || S.keys[0];
  sel.value = S.keys.includes(current) ? current : preferred || "";
}

function renderMemoryBreakdown() {
  const last = (k) => { const s = S.series[k]; return s && s.values.length ? s.values[s.values.length - 1] : null; };
  const parts = [["parameters", last("memory/params")], ["gradients", last("memory/grads")], ["optimizer state", last("memory/optimizer_state")]];
  const total = last("memory/cuda_allocated") ?? last("memory/rss");
  if (parts.every(([, v]) => v === null)) { $("memory-breakdown").replaceChildren(); return; }
  const known = parts.reduce((a, [, v]) => a + (v || 0), 0);
  if (total !== null) parts.push([S.series["memory/cuda_allocated"] ? "activations, cache & rest" : "rest of the process", Math.max(0, total - known)]);
  $("memory-breakdown").replaceChildren(GW.el("table", {}, ...parts.map(([n, v]) => GW.el("tr", {}, GW.el("td", {}, n), GW.el("td", {}, GW.fmtBytes(v))))));
}

function onLive(msg) {
  if (S.loading) { S.buffer.push(msg); return; }
  if (msg.type === "points") {
    for (const [k, s] of Object.entries(msg.series)) {
      if (!S.keys.includes(k)) { S.keys.push(k); S.keys.sort(); renderOtherKeys(); }
      const store = S.series[k] || (S.series[k] = { steps: [], values: [], walls: [] });
      const lastStep = store.steps.length ? store.steps[store.steps.length - 1] : -1;
      const from = store.steps.length;
      s.steps.forEach((step, i) => { if (step > lastStep || store.steps.length > from) { store.steps.push(step); store.values.push(GW.num(s.values[i])); store.walls.push(s.wall_times[i]); } });
      if (store.steps.length > from && S.dirty[k] === undefined) S.dirty[k] = from;
    }
    if (msg.vectors && msg.vectors.grad) HEAT.append(msg.vectors.grad);
    if (msg.last_step !== null && S.run) { S.run.last_step = msg.last_step; renderHeader(); }
    scheduleFlush();
  } else if (msg.type === "alert") {
    if (S.alerts.some((a) => a.id === msg.alert.id)) return;  // pushed while the page was fetching it
    S.alerts.push(msg.alert); renderAlerts(); notify(msg.alert);
  } else if (msg.type === "run") {
    S.run = Object.assign(S.run || {}, msg.run); renderHeader(); if (msg.run.error) renderError();
    if (msg.run.error === undefined) GW.getJSON(`/api/runs/${RUN_ID}`).then((r) => { S.run = r; renderError(); });
  } else if (msg.type === "deleted") {
    $("alerts").prepend(GW.el("div", { class: "alert critical", "data-kind": "deleted" }, "This run was deleted, with all its data. ",
      GW.el("a", { href: "/" }, "Back to the runs list")));
  } else if (msg.type === "resync") load();
}

// Redraws are throttled to one per 150 ms, or further when a redraw is slow (big runs, slow
// machines): the wait is 3x the last redraw, so chart updates never take over the page.
let flushTimer = null, lastFlushMs = 0;
function scheduleFlush() { if (!flushTimer) flushTimer = setTimeout(() => requestAnimationFrame(timedFlush), Math.max(150, 3 * lastFlushMs)); }
function timedFlush() { const t = performance.now(); flush(); lastFlushMs = performance.now() - t; }
function flush() {
  flushTimer = null;
  const fresh = S.dirty; S.dirty = {};
  // A long live session would grow every series without bound: past 2x the chart budget, fold it
  // back to the budget with the same spike-keeping envelope the server uses, and redraw.
  const compacted = new Set();
  for (const k of Object.keys(fresh)) {
    if (S.series[k] && S.series[k].steps.length > 2 * MAX_POINTS) { S.series[k] = GW.compact(S.series[k], MAX_POINTS); compacted.add(k); }
  }
  for (const c of Object.values(CHARTS)) {
    const entries = entriesFor(c);
    if (entries.some((e) => compacted.has(e.label))) c.chart.render(entries, xMode());
    else if (entries.some((e) => fresh[e.label] !== undefined)) c.chart.extend(entries, fresh, xMode());
  }
  renderMemoryBreakdown();
}

function notify(alert) {
  if (!document.hidden || !("Notification" in window) || Notification.permission !== "granted") return;
  new Notification("gradwatch: " + alert.kind + " in " + (S.run ? S.run.name : "run " + RUN_ID), { body: alert.message });
}
$("notify").addEventListener("click", async () => {
  if ("Notification" in window) $("notify").textContent = "Notifications: " + (await Notification.requestPermission());
});

// Zoom: fetch full-resolution points for the visible step range.
for (const [name, c] of Object.entries(CHARTS)) {
  const attach = () => c.chart.div.on && c.chart.div.on("plotly_relayout", async (ev) => {
    if (xMode() !== "step" || c.ignoreRelayout) return;
    if (ev["xaxis.autorange"]) return c.chart.render(entriesFor(c), xMode());
    const [lo, hi] = GW.xRange(ev);
    if (lo === undefined || hi === undefined) return;
    const detail = await Promise.all(c.keys(S.keys).map(async (k) => {
      const s = await GW.getJSON(`/api/runs/${RUN_ID}/series?key=${encodeURIComponent(k)}&start=${Math.floor(lo)}&end=${Math.ceil(hi)}&max_points=${MAX_POINTS}`);
      return { label: k, series: { steps: s.steps, values: s.values.map(GW.num), walls: s.wall_times } };
    }));
    c.ignoreRelayout = true;
    try { c.chart.render(detail, "step"); await Plotly.relayout(c.chart.div, { "xaxis.range": [lo, hi] }); }
    finally { c.ignoreRelayout = false; }
  });
  c.attach = attach;
}
// Plotly adds .on() to a div when it first draws it; renderAll attaches the zoom handler then, once.
function attachAll() { for (const c of Object.values(CHARTS)) if (!c.attached && c.chart.div.on) { c.attach(); c.attached = true; } }

for (const a of document.querySelectorAll("a.csv[data-key]")) a.href = `/api/runs/${RUN_ID}/series.csv?key=${encodeURIComponent(a.dataset.key)}`;
$("other-key").addEventListener("change", async () => {
  const k = $("other-key").value;
  if (k && !S.series[k]) S.series[k] = await fetchSeries(k);
  $("other-csv").href = `/api/runs/${RUN_ID}/series.csv?key=${encodeURIComponent(k)}`;
  CHARTS.other.chart.render(entriesFor(CHARTS.other), xMode());
});
$("x-mode").addEventListener("change", renderAll);
for (const name of Object.keys(CHARTS)) $(name + "-log").addEventListener("change", () => CHARTS[name].chart.render(entriesFor(CHARTS[name]), xMode()));
$("smoothing").addEventListener("input", () => { $("smoothing-value").textContent = Number($("smoothing").value).toFixed(2); CHARTS.loss.chart.render(entriesFor(CHARTS.loss), xMode()); });
GW.live("/ws/runs/" + RUN_ID, onLive, load);
