// One run, live: charts that append as points are committed, alerts, heatmap, config, errors.

import { keySteps, notify, renderAlerts, upsert } from "../lib/alerts.js";
import { LiveChart } from "../lib/charts.js";
import { configTree, kv } from "../lib/config.js";
import { isLossKey, isLrKey, KEYS } from "../lib/contract.js";
import { $, el, throttle } from "../lib/dom.js";
import { fetchSeries, getJSON } from "../lib/fetch.js";
import { fmtTime, kindTitle } from "../lib/format.js";
import { LiveHeatmap } from "../lib/heatmap.js";
import { byType, LoadBuffer, live } from "../lib/live.js";
import { navProject } from "../lib/nav.js";
import { PALETTE, xRange } from "../lib/plot.js";
import { loadPlotly } from "../lib/plotly_load.js";
import { quickChart } from "../lib/quickchart.js";
import { appendPoints, foldIfLong, MAX_POINTS, nearestIndex } from "../lib/series.js";
import { renderIncidentLine } from "./run/incident_bar.js";
import { renderLrFind } from "./run/lr_find.js";
import { mountMedia } from "./run/media.js";
import { MEMORY_KEYS, renderMemoryBreakdown } from "./run/memory.js";
import { isHookMetric, isMetric, metricCard, metricSection } from "./run/metrics.js";
import { renderRanks } from "./run/ranks.js";
import { mountSections } from "./run/sections.js";
import { mountSignals } from "./run/signals.js";
import { axisOf, joinByStep, offerKeys, seriesAgainst, xAt, xKeyOf } from "./run/xaxis.js";

const RUN_ID = Number(location.pathname.split("/").pop());
const S = {
  run: null,
  keys: [],
  series: {},
  against: {}, // key -> its series against the chosen x key (run/xaxis.js), for that x key only
  alerts: [],
  buffer: new LoadBuffer(), // live messages that arrive while load() fetches
  dirty: {},
  late: new Set(),
  t0: 0,
  seenStep: -1,
};
const HEAT = new LiveHeatmap($("heatmap"), RUN_ID, KEYS.GRAD_VECTOR);
mountSignals(HEAT, RUN_ID); // update ratio and output RMS heatmaps beside it (signals.js)
const MEDIA = mountMedia($("media"), RUN_ID); // histograms, images, tables, run.summary (run/media.js)

const WATCH_HINT = (what) => `No ${what} yet. run.watch(model, optimizer) records it at every optimizer step.`;
const xMode = () => $("x-mode").value;
const modeOf = (c) => axisOf(xMode(), S.run, c.metricKey); // a chart's axis: the page's, or its key's own
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
      note.textContent = y.auto ? `(auto: ${Math.floor(y.decades)} decades)` : "";
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
      { t0: () => S.t0, redraw: () => c.chart.render(entriesFor(c), modeOf(c)), xTitle: X_TITLE },
      logOpt,
      spec,
      { onAxis },
    ),
  );
  box.addEventListener("change", () => c.chart.render(entriesFor(c), modeOf(c)));
  CHARTS[name] = c;
  return c;
}

const fixed = (name, spec) => addChart(name, $("chart-" + name), $(name + "-log"), $(name + "-log-note"), spec);
fixed("loss", {
  keys: (ks) => ks.filter(isLossKey),
  smoothing: () => Number($("smoothing").value),
  empty: 'No loss logged yet: run.log({"loss": loss}).',
});
// What backward produced (before clipping), what reached the optimizer when clipping changed it, the
// threshold clipping used (docs/gradients.md), and each model's own norm when a run watches several.
const GNORMS = [KEYS.GLOBAL_NORM, KEYS.GLOBAL_NORM_CLIPPED, KEYS.CLIP_THRESHOLD];
const MODEL_NORM = KEYS.GLOBAL_NORM + "/";
const GNORM_LABELS = {
  [KEYS.GLOBAL_NORM]: "before clipping",
  [KEYS.GLOBAL_NORM_CLIPPED]: "after clipping (reached the weights)",
  [KEYS.CLIP_THRESHOLD]: "clip threshold (max_norm)",
};
fixed("gnorm", {
  keys: (ks) => [...GNORMS.filter((k) => ks.includes(k)), ...ks.filter((k) => k.startsWith(MODEL_NORM))],
  label: (k) =>
    k.startsWith(MODEL_NORM) ? `model ${k.slice(MODEL_NORM.length)}, before clipping` : GNORM_LABELS[k] || k,
  empty: WATCH_HINT("gradient norm"),
});
fixed("lr", { keys: (ks) => ks.filter(isLrKey), empty: WATCH_HINT("learning rate"), sameAsOne: true });
fixed("memory", {
  keys: (ks) => ks.filter((k) => k.startsWith(KEYS.CUDA_PREFIX) || k === KEYS.RSS),
  bytes: true,
  empty: WATCH_HINT("memory"),
});

// Every other key the script logs gets a chart of its own, in a section per key prefix (val/, train/...).
function ensureMetricChart(key) {
  if (!isMetric(key) || CHARTS["m:" + key]) return;
  const card = metricCard(key, RUN_ID);
  metricSection($(isHookMetric(key) ? "system-metrics" : "metrics"), key).append(card.root);
  const spec = { keys: () => [key], empty: "No points yet.", scalars: true, metricKey: key };
  addChart("m:" + key, card.chart, card.box, card.note, spec);
}

// With a key as x axis, the charts draw the series aligned to it (S.against), a chart on its key's own
// step_metric the series joined to that key's values by step, else the raw ones.
const held = (k, c) => {
  if (modeOf(c) !== xMode()) return S.series[k] && joinByStep(S.series[k], S.series[modeOf(c)]);
  return xKeyOf(xMode()) ? S.against[k] : S.series[k];
};
const entriesFor = (c) => {
  const entries = c
    .keys(S.keys)
    .filter((k) => held(k, c))
    .map((k, i) => ({ label: c.label ? c.label(k) : k, series: held(k, c), color: PALETTE[i % PALETTE.length] }));
  return c.sameAsOne ? mergeIdentical(entries) : entries;
};

// Series with the very same points (two parameter groups on one schedule) as one line, named for all.
function mergeIdentical(entries) {
  const out = [];
  for (const e of entries) {
    const twin = out.find((o) => sameSeries(o.series, e.series));
    if (twin) {
      twin.label += ", " + e.label;
      twin.keys.push(e.label);
    } else out.push({ ...e, keys: [e.label] });
  }
  return out;
}
const sameSeries = (a, b) =>
  a.steps.length === b.steps.length &&
  a.steps.every((s, i) => s === b.steps[i]) &&
  a.values.every((v, i) => Object.is(v, b.values[i]));

// The charts of the first viewport: fetched and drawn before anything else on a big run.
const FIRST = ["loss", "gnorm", "lr"];
const fetchAll = async (keys) =>
  Object.fromEntries(
    await Promise.all(keys.map(async (k) => [k, await fetchSeries(RUN_ID, k, "max_points=" + MAX_POINTS)])),
  );

async function load() {
  S.buffer.start();
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
    // First the loss, gradient norm and LR (the first viewport): asked for before anything else is
    // built, drawn at once; then the rest.
    const first = [...new Set(FIRST.flatMap((n) => CHARTS[n].keys(keys)))];
    const firstSeries = fetchAll(first);
    renderText();
    for (const k of keys) ensureMetricChart(k);
    offerKeys($("x-mode"), keys);
    // The memory breakdown's parts are fetched too: they are on the page from the first draw, not
    // only once a live memory point arrives.
    const wanted = new Set(
      [
        ...Object.values(CHARTS).flatMap((c) => c.keys(keys)),
        ...MEMORY_KEYS.filter((k) => keys.includes(k)),
        ...Object.values(run.defined_metrics || {}).map((d) => d.step_metric), // define_metric's x axes
      ].filter((k) => keys.includes(k)),
    );
    S.series = await firstSeries;
    // Sketched at once (quickchart.js) while Plotly starts up (1-2 s) and the other series arrive.
    sketchFirst();
    const rest = fetchAll([...wanted].filter((k) => !first.includes(k)));
    await loadPlotly();
    renderFirst();
    Object.assign(S.series, await rest);
    if (xKeyOf(xMode())) await fetchAgainst();
  } catch (e) {
    loadPlotly().catch(() => {}); // the live points that may follow draw with it
    $("notice").replaceChildren(
      el("div", { class: "alert critical", "data-kind": "load-failed" }, "Could not load run: " + e.message),
    );
    S.buffer.end(() => {}); // the page shows the failure; the next (re)connect loads again
    return;
  }
  renderAll();
  if (!S.ranksShown) {
    S.ranksShown = true;
    renderRanks($("ranks"), S.run, S.keys);
  }
  S.buffer.end(onLive);
}

// The first viewport's charts as plain SVG, before Plotly has run: the data at once, interaction later.
function sketchFirst() {
  if (window.Plotly || xMode() !== "step") return;
  for (const n of FIRST) {
    if (modeOf(CHARTS[n]) !== "step") continue; // drawn against its define_metric step_metric: Plotly's
    const c = CHARTS[n],
      entries = entriesFor(c);
    const y =
      entries.length &&
      quickChart(c.chart.div, entries, { log: c.chart.opts.log(), smoothing: c.chart.opts.smoothing?.() });
    if (y) c.chart.opts.onAxis(y); // the log-y box says what the sketch chose
  }
}

// The header, the incident line, the error and the side panel: no Plotly needed, shown with the sketches.
function renderText() {
  $("notice").querySelector("[data-kind='load-failed']")?.remove();
  renderHeader();
  renderAlertList();
  renderError();
  renderConfig();
}

// What the first viewport shows: the header, the incident line, the error, the side panel and the
// loss, gradient norm and LR charts (on a step axis; a key axis waits for its aligned series).
function renderFirst() {
  renderText();
  if (!xKeyOf(xMode())) for (const n of FIRST) CHARTS[n].chart.render(entriesFor(CHARTS[n]), modeOf(CHARTS[n]));
  // Per-layer norms are keys grad/<layer>: without any, say so rather than ask for a heatmap (a 404).
  if (!HEAT.zoomed) {
    if (S.keys.some((k) => k.startsWith(KEYS.GRAD_PREFIX) && !GNORMS.includes(k) && !k.startsWith(MODEL_NORM)))
      HEAT.load();
    else if (!HEAT.loaded) HEAT.showEmpty();
  }
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
  for (const c of Object.values(CHARTS)) c.chart.render(entriesFor(c), modeOf(c));
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
  navProject(r.project);
}

function renderAlertList() {
  renderAlerts($("alerts"), S.alerts, zoomTo, () =>
    renderIncidentLine($("incident-bar"), $("incident-line"), S.alerts),
  );
  renderAlertLines();
}

// Diagnose an alert: every chart and the heatmap zoom to the steps around it, at full detail.
async function zoomTo(step) {
  if (xMode() !== "step") {
    $("x-mode").value = "step";
    await onXMode();
  }
  const lo = Math.max(0, step - 50),
    hi = step + 50;
  for (const c of Object.values(CHARTS))
    if (c.chart.drawn && modeOf(c) === "step") Plotly.relayout(c.chart.div, { "xaxis.range": [lo, hi] });
  if (HEAT.loaded) {
    HEAT.zoomed = [lo, hi];
    HEAT.load(HEAT.zoomed);
  }
  document.querySelector("details[data-section='training']").open = true;
  $("chart-loss").scrollIntoView({ behavior: "smooth", block: "start" });
}

function alertX(step) {
  if (xMode() === "step") return step;
  if (xKeyOf(xMode())) return xAt(S.series[xKeyOf(xMode())], step);
  const s = S.series[KEYS.GLOBAL_NORM] || S.series.loss || Object.values(S.series)[0];
  if (!s?.steps.length) return null;
  const i = nearestIndex(s.steps, step);
  return xMode() === "wall" ? new Date(s.walls[i] * 1000) : s.walls[i] - S.t0;
}

// One marker per incident's key step (the first alert of each of its kinds), named on hover.
function renderAlertLines() {
  const marks = keySteps(S.alerts)
    .map((a) => ({
      x: alertX(a.step),
      color: a.severity === "critical" ? "#d92d20" : "#b54708",
      label: "▾",
      text: `${kindTitle(a.kind)} at step ${a.step}: ${a.message}`,
    }))
    .filter((m) => m.x !== null);
  for (const c of Object.values(CHARTS)) c.chart.setAlertLines(marks);
}

function renderError() {
  const err = S.run.error,
    box = $("error");
  if (!err) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  // The error in one line, the diagnosis' title beside it; its advice and the traceback folded below
  // (they are long, and the charts come first).
  const d = err.diagnosis;
  box.replaceChildren(
    el("b", {}, "The training script failed: " + err.exc_type + " "),
    el("span", {}, err.message),
    d ? el("b", { class: "diagnosis" }, " — " + d.title + ".") : null,
    el(
      "details",
      { class: "traceback" },
      el("summary", { class: "muted" }, d ? "Diagnosis and traceback" : "Traceback"),
      d ? el("p", {}, d.advice) : null,
      err.traceback ? el("pre", {}, err.traceback) : null,
    ),
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

// Live messages, by type; while load() fetches they are held (S.buffer) and replayed after it.
const onLive = byType(
  {
    points: onPoints,
    alert(msg) {
      // An id already held is an update (a repeat counted on the server); only new alerts notify.
      if (upsert(S.alerts, msg.alert)) notify(msg.alert, S.run ? S.run.name : "run " + RUN_ID);
      renderAlertList();
      renderLrFind($("lr-find"), S);
    },
    run(msg) {
      S.run = Object.assign(S.run || {}, msg.run);
      renderHeader();
      if (msg.run.status && msg.run.status !== "running") MEDIA(); // the run ended: what it logged last
      if (msg.run.error) renderError();
      if (msg.run.error === undefined)
        getJSON(`/api/runs/${RUN_ID}`).then((r) => {
          S.run = r;
          renderError();
        });
    },
    deleted() {
      $("notice").prepend(
        el(
          "div",
          { class: "alert critical", "data-kind": "deleted" },
          "This run was deleted, with all its data. ",
          el("a", { href: "/" }, "Back to the runs list"),
        ),
      );
    },
    resync: () => load(),
  },
  S.buffer,
);

// Redraws are throttled to one per 150 ms, or 3x the last redraw's cost (big runs, slow machines).
const scheduleFlush = throttle(flush, 150, 3, "run-flush");
function flush() {
  const fresh = S.dirty;
  S.dirty = {};
  // A long live session would grow every series without bound: past 2x the chart budget, fold it
  // back to the budget with the same spike-keeping envelope the server uses, and redraw.
  const redraw = new Set();
  for (const k of Object.keys(fresh)) {
    const folded = S.series[k] && foldIfLong(S.series[k]);
    if (folded && folded !== S.series[k]) {
      S.series[k] = folded;
      redraw.add(k);
    }
  }
  if (xKeyOf(xMode()))
    refetchAgainst(); // aligned on the server: fetched again, not extended here
  else
    for (const c of Object.values(CHARTS)) {
      const entries = entriesFor(c),
        from = freshOf(entries, fresh);
      if (modeOf(c) !== xMode()) {
        if (fresh[c.metricKey] !== undefined || fresh[modeOf(c)] !== undefined) c.chart.render(entries, modeOf(c));
      } else if (entries.some((e) => (e.keys || [e.label]).some((k) => redraw.has(k))))
        c.chart.render(entries, xMode());
      else if (entries.some((e) => from[e.label] !== undefined)) c.chart.extend(entries, from, xMode());
    }
  renderMemoryBreakdown($("memory-breakdown"), S.series);
  renderLrFind($("lr-find"), S);
  refetchLate();
}

// Where each entry's new points start; a merged entry (identical series) from its first key's.
function freshOf(entries, fresh) {
  const out = { ...fresh };
  for (const e of entries) if (e.keys) out[e.label] = fresh[e.keys[0]];
  return out;
}

// Out-of-order points were not appended: fetch those keys again and redraw their charts.
async function refetchLate() {
  const keys = [...S.late];
  S.late.clear();
  for (const k of keys) {
    S.series[k] = await fetchSeries(RUN_ID, k, "max_points=" + MAX_POINTS);
    for (const c of Object.values(CHARTS)) if (c.keys(S.keys).includes(k)) c.chart.render(entriesFor(c), modeOf(c));
  }
}

// Zoom: fetch full-resolution points for the visible step range.
function attachZoom(c) {
  const div = c.chart.div;
  div.on("plotly_relayout", async (ev) => {
    if (modeOf(c) !== "step" || c.ignoreRelayout) return;
    if (ev["xaxis.autorange"]) return c.chart.render(entriesFor(c), modeOf(c));
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
mountSections();
export const state = S,
  heatmap = HEAT; // for benchmarks/bench_pages.py
live("/ws/runs/" + RUN_ID, onLive, load);
