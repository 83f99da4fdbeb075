// One run, live: charts that append as points are committed, alerts, heatmap, config, errors.

import { notify, renderAlerts, upsert } from "./alerts.js";
import { LiveChart } from "./charts.js";
import {
  appendPoints,
  compact,
  el,
  fetchSeries,
  fmtTime,
  getJSON,
  isLossKey,
  isLrKey,
  KEYS,
  live,
  PALETTE,
  throttle,
  xRange,
} from "./common.js";
import { configTree, kv } from "./config_view.js";
import { LiveHeatmap } from "./heatmap.js";
import { renderLrFind } from "./lr_find.js";
import { MEMORY_KEYS, renderMemoryBreakdown } from "./memory_view.js";
import { isMetric, metricCard, metricSection } from "./metrics.js";
import { renderRanks } from "./ranks.js";
import { mountMedia } from "./run_media.js";
import { offerKeys, seriesAgainst, xAt, xKeyOf } from "./run_xaxis.js";
import { mountSignals } from "./signals.js";

const RUN_ID = Number(location.pathname.split("/").pop());
const $ = (id) => document.getElementById(id);
const S = {
  run: null,
  keys: [],
  series: {},
  against: {}, // key -> its series against the chosen x key (run_xaxis.js), for that x key only
  alerts: [],
  loading: true,
  buffer: [],
  dirty: {},
  late: new Set(),
  t0: 0,
  seenStep: -1,
};
const MAX_POINTS = 4000;
const HEAT = new LiveHeatmap($("heatmap"), RUN_ID, KEYS.GRAD_VECTOR);
mountSignals(HEAT, RUN_ID); // update ratio and output RMS heatmaps beside it (signals.js)
const MEDIA = mountMedia($("media"), RUN_ID); // histograms, images, tables, run.summary (run_media.js)

const WATCH_HINT = (what) => `No ${what} yet. run.watch(model, optimizer) records it at every optimizer step.`;
const xMode = () => $("x-mode").value;
const X_TITLE = (mode) => xKeyOf(mode) ?? (mode === "relative" ? "seconds" : "");
const CHARTS = {}; // name -> {keys(allKeys), chart, box}; the fixed four, then one per logged metric

// A log-y checkbox is "auto" until the user touches it: the chart then picks log for series
// spanning more than 3 decades and says so beside the box.
function logOption(box, note) {
  box.addEventListener("change", () => {
    box.dataset.user = "1";
  });
  return {
    log: () => (box.dataset.user ? box.checked : null),
    onAxis: (y) => {
      box.checked = y.log;
      note.textContent = y.auto ? `(auto: values span ${Math.floor(y.decades)} decades)` : "";
    },
  };
}

function addChart(name, div, box, note, spec) {
  const c = Object.assign({ box }, spec),
    logOpt = logOption(box, note);
  // Plotly adds .on() to a div at its first draw: the zoom handler is attached then, once.
  const onAxis = (y) => {
    logOpt.onAxis(y);
    if (!c.zoomable && div.on) {
      c.zoomable = true;
      attachZoom(c);
    }
  };
  c.chart = new LiveChart(
    div,
    Object.assign(
      { t0: () => S.t0, redraw: () => c.chart.render(entriesFor(c), xMode()), xTitle: X_TITLE },
      logOpt,
      spec,
      { onAxis },
    ),
  );
  box.addEventListener("change", () => c.chart.render(entriesFor(c), xMode()));
  CHARTS[name] = c;
  return c;
}

const fixed = (name, spec) => addChart(name, $("chart-" + name), $(name + "-log"), $(name + "-log-note"), spec);
fixed("loss", {
  keys: (ks) => ks.filter(isLossKey),
  smoothing: () => Number($("smoothing").value),
  empty: 'No loss logged yet: run.log({"loss": loss}).',
});
// Before clipping, and (Lightning, Hugging Face with clipping on) the clipped norm the optimizer got.
const GNORMS = [KEYS.GLOBAL_NORM, KEYS.GLOBAL_NORM_CLIPPED];
fixed("gnorm", { keys: (ks) => GNORMS.filter((k) => ks.includes(k)), empty: WATCH_HINT("gradient norm") });
fixed("lr", { keys: (ks) => ks.filter(isLrKey), empty: WATCH_HINT("learning rate") });
fixed("memory", {
  keys: (ks) => ks.filter((k) => k.startsWith(KEYS.CUDA_PREFIX) || k === KEYS.RSS),
  bytes: true,
  empty: WATCH_HINT("memory"),
});

// Every other key the script logs gets a chart of its own, in a section per key prefix (val/, train/...).
function ensureMetricChart(key) {
  if (!isMetric(key) || CHARTS["m:" + key]) return;
  const card = metricCard(key, RUN_ID);
  metricSection($("metrics"), key).append(card.root);
  addChart("m:" + key, card.chart, card.box, card.note, { keys: () => [key], empty: "No points yet.", scalars: true });
}

// With a key as x axis, the charts draw the series aligned to it (S.against), else the raw ones.
const held = (k) => (xKeyOf(xMode()) ? S.against[k] : S.series[k]);
const entriesFor = (c) =>
  c
    .keys(S.keys)
    .filter((k) => held(k))
    .map((k, i) => ({ label: k, series: held(k), color: PALETTE[i % PALETTE.length] }));

async function load() {
  S.loading = true;
  S.buffer = [];
  try {
    const [run, keys, alerts] = await Promise.all([
      getJSON(`/api/runs/${RUN_ID}`),
      getJSON(`/api/runs/${RUN_ID}/keys`),
      getJSON(`/api/runs/${RUN_ID}/alerts`),
    ]);
    S.run = run;
    S.keys = keys;
    S.alerts = alerts;
    S.t0 = run.meta?.start_time || run.created_at; // the client clock, like the points
    for (const k of keys) ensureMetricChart(k);
    offerKeys($("x-mode"), keys);
    // The memory breakdown's parts are fetched too: they are on the page from the first draw, not
    // only once a live memory point arrives.
    const wanted = new Set([
      ...Object.values(CHARTS).flatMap((c) => c.keys(keys)),
      ...MEMORY_KEYS.filter((k) => keys.includes(k)),
    ]);
    const fetched = await Promise.all(
      [...wanted].map(async (k) => [k, await fetchSeries(RUN_ID, k, "max_points=" + MAX_POINTS)]),
    );
    S.series = Object.fromEntries(fetched);
    if (xKeyOf(xMode())) await fetchAgainst();
  } catch (e) {
    $("notice").replaceChildren(
      el("div", { class: "alert critical", "data-kind": "load-failed" }, "Could not load run: " + e.message),
    );
    return;
  } finally {
    S.loading = false;
  }
  $("notice").querySelector("[data-kind='load-failed']")?.remove();
  renderHeader();
  renderAlertList();
  renderError();
  renderConfig();
  renderAll();
  if (!S.ranksShown) {
    S.ranksShown = true;
    renderRanks($("ranks"), S.run, S.keys);
  }
  // Per-layer norms are keys grad/<layer>: without any, say so rather than ask for a heatmap (a 404).
  if (!HEAT.zoomed) {
    if (S.keys.some((k) => k.startsWith(KEYS.GRAD_PREFIX) && !GNORMS.includes(k))) HEAT.load();
    else if (!HEAT.loaded) HEAT.showEmpty();
  }
  for (const msg of S.buffer) onLive(msg);
  S.buffer = [];
}

// Every charted key against the chosen x key, fetched again when it changes or points arrive.
async function fetchAgainst() {
  const x = xKeyOf(xMode()),
    keys = [...new Set(Object.values(CHARTS).flatMap((c) => c.keys(S.keys)))].filter((k) => S.series[k]);
  const got = await Promise.all(keys.map(async (k) => [k, await seriesAgainst(RUN_ID, k, x)]));
  if (xKeyOf(xMode()) === x) S.against = Object.fromEntries(got); // not if the user chose again meanwhile
}
const refetchAgainst = throttle(() => fetchAgainst().then(renderAll), 2000, 1);

async function onXMode() {
  S.against = {};
  if (xKeyOf(xMode())) await fetchAgainst();
  renderAll();
}

function renderAll() {
  for (const c of Object.values(CHARTS)) c.chart.render(entriesFor(c), xMode());
  renderAlertLines();
  renderMemoryBreakdown($("memory-breakdown"), S.series);
  renderLrFind($("lr-find"), S);
}

function renderHeader() {
  const r = S.run;
  document.title = "gradwatch - " + r.name;
  $("run-name").textContent = r.name;
  $("run-project").textContent = r.project;
  $("run-status").textContent = r.status;
  $("run-status").className = "status " + r.status;
  // The latest step the page holds a point of, when live points ran ahead of the run record.
  const step = Math.max(r.last_step ?? -1, S.seenStep);
  $("run-step").textContent = step < 0 ? "" : "step " + step;
}

function renderAlertList() {
  renderAlerts($("alerts"), S.alerts, zoomTo);
  renderAlertLines();
}

// Diagnose an alert: every chart and the heatmap zoom to the steps around it, at full detail.
async function zoomTo(step) {
  if (xMode() !== "step") {
    $("x-mode").value = "step";
    renderAll();
  }
  const lo = Math.max(0, step - 50),
    hi = step + 50;
  for (const c of Object.values(CHARTS)) if (c.chart.drawn) Plotly.relayout(c.chart.div, { "xaxis.range": [lo, hi] });
  if (HEAT.loaded) {
    HEAT.zoomed = [lo, hi];
    HEAT.load(HEAT.zoomed);
  }
  $("chart-loss").scrollIntoView({ behavior: "smooth", block: "start" });
}

function alertX(step) {
  if (xMode() === "step") return step;
  if (xKeyOf(xMode())) return xAt(S.series[xKeyOf(xMode())], step);
  const s = S.series[KEYS.GLOBAL_NORM] || S.series.loss || Object.values(S.series)[0];
  if (!s?.steps.length) return null;
  let i = s.steps.findIndex((x) => x >= step);
  if (i < 0) i = s.steps.length - 1;
  return xMode() === "wall" ? new Date(s.walls[i] * 1000) : s.walls[i] - S.t0;
}

function renderAlertLines() {
  const xs = S.alerts
    .filter((a) => a.step !== null && a.step !== undefined)
    .map((a) => alertX(a.step))
    .filter((x) => x !== null);
  for (const c of Object.values(CHARTS)) c.chart.setAlertLines(xs);
}

function renderError() {
  const err = S.run.error,
    box = $("error");
  if (!err) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  box.replaceChildren(
    el("h3", {}, "The training script failed: " + err.exc_type),
    el("p", {}, err.message),
    err.diagnosis ? el("p", {}, el("b", {}, err.diagnosis.title + ". "), err.diagnosis.advice) : null,
    el("pre", {}, err.traceback || ""),
  );
}

function renderConfig() {
  $("config").replaceChildren(...configTree(S.run.config || {}).childNodes);
  const m = S.run.meta || {};
  kv($("meta"), {
    id: S.run.id,
    started: fmtTime(S.run.created_at),
    host: m.host,
    pid: m.pid,
    device: m.device,
    python: m.python,
    torch: m.torch,
    git: m.git_commit,
    command: (m.command || []).join(" "),
    tags: (S.run.tags || []).join(", "),
    notes: S.run.notes,
  });
}

function onPoints(msg) {
  for (const [k, pts] of Object.entries(msg.series)) {
    if (!S.keys.includes(k)) {
      S.keys.push(k);
      ensureMetricChart(k);
      offerKeys($("x-mode"), [k]);
    }
    S.series[k] ??= { steps: [], values: [], walls: [] };
    const store = S.series[k];
    const { from, late } = appendPoints(store, pts);
    if (store.steps.length) S.seenStep = Math.max(S.seenStep, store.steps[store.steps.length - 1]);
    if (from !== undefined && S.dirty[k] === undefined) S.dirty[k] = from;
    if (late) S.late.add(k);
  }
  if (msg.vectors?.grad) HEAT.append(msg.vectors.grad);
  if (msg.last_step !== null && msg.last_step !== undefined && S.run)
    S.run.last_step = Math.max(S.run.last_step ?? -1, msg.last_step);
  if (S.run) renderHeader();
  scheduleFlush();
}

function onLive(msg) {
  if (S.loading) {
    S.buffer.push(msg);
    return;
  }
  if (msg.type === "points") onPoints(msg);
  else if (msg.type === "alert") {
    // An id already held is an update (a repeat counted on the server); only new alerts notify.
    if (upsert(S.alerts, msg.alert)) notify(msg.alert, S.run ? S.run.name : "run " + RUN_ID);
    renderAlertList();
    renderLrFind($("lr-find"), S);
  } else if (msg.type === "run") {
    S.run = Object.assign(S.run || {}, msg.run);
    renderHeader();
    if (msg.run.status && msg.run.status !== "running") MEDIA(); // the run ended: what it logged last
    if (msg.run.error) renderError();
    if (msg.run.error === undefined)
      getJSON(`/api/runs/${RUN_ID}`).then((r) => {
        S.run = r;
        renderError();
      });
  } else if (msg.type === "deleted") {
    $("notice").prepend(
      el(
        "div",
        { class: "alert critical", "data-kind": "deleted" },
        "This run was deleted, with all its data. ",
        el("a", { href: "/" }, "Back to the runs list"),
      ),
    );
  } else if (msg.type === "resync") load();
}

// Redraws are throttled to one per 150 ms, or 3x the last redraw's cost (big runs, slow machines).
const scheduleFlush = throttle(flush, 150, 3, "run-flush");
function flush() {
  const fresh = S.dirty;
  S.dirty = {};
  // A long live session would grow every series without bound: past 2x the chart budget, fold it
  // back to the budget with the same spike-keeping envelope the server uses, and redraw.
  const redraw = new Set();
  for (const k of Object.keys(fresh)) {
    if (S.series[k] && S.series[k].steps.length > 2 * MAX_POINTS) {
      S.series[k] = compact(S.series[k], MAX_POINTS);
      redraw.add(k);
    }
  }
  if (xKeyOf(xMode()))
    refetchAgainst(); // aligned on the server: fetched again, not extended here
  else
    for (const c of Object.values(CHARTS)) {
      const entries = entriesFor(c);
      if (entries.some((e) => redraw.has(e.label))) c.chart.render(entries, xMode());
      else if (entries.some((e) => fresh[e.label] !== undefined)) c.chart.extend(entries, fresh, xMode());
    }
  renderMemoryBreakdown($("memory-breakdown"), S.series);
  renderLrFind($("lr-find"), S);
  refetchLate();
}

// Out-of-order points were not appended: fetch those keys again and redraw their charts.
async function refetchLate() {
  const keys = [...S.late];
  S.late.clear();
  for (const k of keys) {
    S.series[k] = await fetchSeries(RUN_ID, k, "max_points=" + MAX_POINTS);
    for (const c of Object.values(CHARTS)) if (c.keys(S.keys).includes(k)) c.chart.render(entriesFor(c), xMode());
  }
}

// Zoom: fetch full-resolution points for the visible step range.
function attachZoom(c) {
  const div = c.chart.div;
  div.on("plotly_relayout", async (ev) => {
    if (xMode() !== "step" || c.ignoreRelayout) return;
    if (ev["xaxis.autorange"]) return c.chart.render(entriesFor(c), xMode());
    const [lo, hi] = xRange(ev);
    if (lo === undefined || hi === undefined) return;
    const q = `start=${Math.floor(lo)}&end=${Math.ceil(hi)}&max_points=${MAX_POINTS}`;
    const detail = await Promise.all(
      c
        .keys(S.keys)
        .filter((k) => S.series[k])
        .map(async (k) => ({ label: k, series: await fetchSeries(RUN_ID, k, q) })),
    );
    c.ignoreRelayout = true;
    try {
      c.chart.render(detail, "step");
      await Plotly.relayout(div, { "xaxis.range": [lo, hi] });
    } finally {
      c.ignoreRelayout = false;
    }
  });
}

// A link names its key as given (data-key) or by its vocabulary name (data-vocab="GLOBAL_NORM").
for (const a of document.querySelectorAll("a.csv[data-key], a.csv[data-vocab]")) {
  const key = a.dataset.vocab ? KEYS[a.dataset.vocab] : a.dataset.key;
  a.href = `/api/runs/${RUN_ID}/series.csv?key=${encodeURIComponent(key)}`;
}
$("x-mode").addEventListener("change", onXMode);
$("smoothing").addEventListener("input", () => {
  $("smoothing-value").textContent = Number($("smoothing").value).toFixed(2);
  CHARTS.loss.chart.render(entriesFor(CHARTS.loss), xMode());
});
$("notify").addEventListener("click", async () => {
  if ("Notification" in window) $("notify").textContent = "Notifications: " + (await Notification.requestPermission());
});
export const state = S,
  heatmap = HEAT; // for benchmarks/bench_pages.py
live("/ws/runs/" + RUN_ID, onLive, load);
