// Overlay metrics across runs: by default a chart per metric they all logged (loss first), one
// colour per run everywhere, alert lines in the run's colour; a summary table and the config diff.

import { keySteps, upsert } from "../lib/alerts.js";
import { LiveChart } from "../lib/charts.js";
import { isLossKey, KEYS, num, TIME_AXES } from "../lib/contract.js";
import { $, el, throttle } from "../lib/dom.js";
import { fetchSeries, getJSON } from "../lib/fetch.js";
import { kindTitle } from "../lib/format.js";
import { byType, LoadBuffer, live } from "../lib/live.js";
import { assignColors, colorFor } from "../lib/plot.js";
import { bySection, isPerLayer, sectionOf } from "../lib/sections.js";
import { appendPoints, foldIfLong, nearestIndex, normalised } from "../lib/series.js";
import { sweepView } from "./compare/groups.js";
import { mountCompareMedia } from "./compare/media.js";
import { renderDiff, renderSummary } from "./compare/tables.js";

const params = new URLSearchParams(location.search);
const IDS = (params.get("ids") || "")
  .split(",")
  .map(Number)
  .filter((n) => n > 0);
// A sweep (group=, or project=/where= instead of ids) is drawn by compare_groups.js.
const SWEEP = params.has("group") || (!IDS.length && (params.has("project") || params.has("where")));
const C = { runs: [], diff: null, keys: [], shared: [], panels: [], alerts: {}, losses: {}, nextId: 0 };
const label = (r) => r.name + " #" + r.id;
const t0Of = (r) => r.meta?.start_time || r.created_at; // each run's own start, for relative time
const xMode = () => $("x-mode").value;

// Charts in the run page's order (lib/sections.js): training, the script's metrics, per layer, system.
const byRank = bySection;
const perLayer = isPerLayer;
// Keys that can be an x axis: what the script counts (tokens, samples, epoch) and the hook's throughput.
const X_SECTIONS = ["metrics", "system"];
const isAxisKey = (k) =>
  X_SECTIONS.includes(sectionOf(k)) &&
  !isLossKey(k) &&
  ![KEYS.MEMORY_PREFIX, KEYS.AMP_PREFIX].some((p) => k.startsWith(p));

function syncUrl() {
  const p = new URLSearchParams({
    ids: C.runs.map((r) => r.id).join(","),
    keys: C.panels.map((pn) => pn.key).join(","),
    x: xMode(),
  });
  if ($("log").checked) p.set("log", "1");
  if ($("normalise").checked) p.set("norm", "1");
  if (Number($("smoothing").value)) p.set("smooth", $("smoothing").value);
  history.replaceState(null, "", "/compare?" + p.toString());
}

// Each id on its own, so that one that does not exist is named instead of blanking the page.
async function findRuns() {
  const found = await Promise.all(
    IDS.map((id) =>
      getJSON(`/api/runs/${id}`).catch((e) => {
        if (e.status === 404) return null;
        throw e;
      }),
    ),
  );
  const missing = IDS.filter((_, i) => !found[i]);
  if (missing.length) {
    const which = missing.length === 1 ? `Run ${missing[0]} does not exist` : `Runs ${missing.join(", ")} do not exist`;
    $("missing").replaceChildren(
      el(
        "div",
        { class: "alert critical", "data-kind": "missing" },
        which + " (deleted, or a mistyped link)." + (found.some(Boolean) ? " Comparing the others." : ""),
      ),
    );
  }
  return found.filter(Boolean);
}

async function load() {
  try {
    C.runs = await findRuns();
  } catch (e) {
    return fail(e);
  }
  if (!C.runs.length) {
    $("panels").replaceChildren(
      el("p", { class: "muted" }, "Nothing to compare. Pick runs on the ", el("a", { href: "/" }, "runs list"), "."),
    );
    return;
  }
  const ids = C.runs.map((r) => r.id);
  assignColors(ids); // up to 10 runs, 10 different colours
  try {
    const [diff, keyLists, alertLists] = await Promise.all([
      getJSON("/api/compare?ids=" + ids.join(",")),
      Promise.all(ids.map((id) => getJSON(`/api/runs/${id}/keys`))),
      Promise.all(ids.map((id) => getJSON(`/api/runs/${id}/alerts`))),
    ]);
    C.diff = diff;
    ids.forEach((id, i) => {
      C.alerts[id] = alertLists[i];
    });
    C.keys = [...new Set(keyLists.flat())].sort(byRank);
    C.shared = C.keys.filter((k) => !perLayer(k) && keyLists.every((ks) => ks.includes(k)));
  } catch (e) {
    return fail(e);
  }
  const metricAxes = C.shared.filter(isAxisKey);
  $("x-mode").append(...metricAxes.map((k) => el("option", { value: k }, k)));
  $("x-mode").value = params.get("x") || "step";
  $("log").checked = params.get("log") === "1";
  $("normalise").checked = params.get("norm") === "1";
  $("smoothing").value = params.get("smooth") || "0";
  $("smoothing-value").textContent = Number($("smoothing").value).toFixed(2);
  $("run-list").replaceChildren(
    ...C.runs.map((r) =>
      el(
        "span",
        {},
        el("span", { class: "swatch", style: "background:" + colorFor(r.id) }),
        el("a", { href: "/runs/" + r.id }, r.name),
        "  ",
      ),
    ),
  );
  renderTables();
  // `keys=a,b` names the charts (the older single `key=a` still works); without it, every shared metric.
  const wanted = (params.get("keys") || params.get("key") || "").split(",").filter((k) => C.keys.includes(k));
  for (const key of wanted.length ? wanted : C.shared) addPanel(key);
  if (!C.panels.length)
    $("panels").replaceChildren(
      el("p", { class: "muted empty-compare" }, "These runs have no metric in common yet: add a chart to pick one."),
    );
  loadLosses();
  mountCompareMedia($("media"), C.runs); // histograms and images side by side (compare/media.js)
  // After a reconnect (server restart, network blip) points may have been missed: refetch then.
  let opens = 0;
  const resync = () => {
    // Data that came between the keys read above and this socket's subscription sent no live message.
    if (!C.panels.length) refreshKeys();
    if (++opens > C.runs.length) {
      for (const pn of C.panels) draw(pn);
      loadLosses();
    }
  };
  for (const r of C.runs) live("/ws/runs/" + r.id, onLive(r), resync);
}

// Runs compared before they logged anything: once data arrives, the metrics they share get their charts.
const refreshKeys = throttle(
  async () => {
    if (C.panels.length) return;
    const lists = await Promise.all(C.runs.map((r) => getJSON(`/api/runs/${r.id}/keys`).catch(() => [])));
    C.keys = [...new Set(lists.flat())].sort(byRank);
    C.shared = C.keys.filter((k) => !perLayer(k) && lists.every((ks) => ks.includes(k)));
    if (!C.panels.length) for (const key of C.shared) addPanel(key);
    if (C.panels.length) syncUrl();
  },
  1000,
  1,
);

function fail(e) {
  $("missing").replaceChildren(
    el("div", { class: "alert critical", "data-kind": "load-failed" }, "Could not load the comparison: " + e.message),
  );
}

// The summary's last and best loss: a 400-point envelope per run keeps every bucket's min.
async function loadLosses() {
  try {
    const out = await getJSON(`/api/sparklines?ids=${C.runs.map((r) => r.id).join(",")}&key=loss&points=400`);
    for (const [id, s] of Object.entries(out.runs)) C.losses[id] = s && { steps: s.steps, values: s.values.map(num) };
  } catch {
    /* the table still shows the rest */
  }
  renderTables();
}
const refreshLosses = throttle(loadLosses, 2000, 1);

function renderTables() {
  // As the runs list counts them: one per alert, a repeat folded into it is not another.
  const counts = Object.fromEntries(C.runs.map((r) => [r.id, (C.alerts[r.id] || []).length]));
  renderSummary($("summary"), C.runs, C.losses, counts);
  if (C.diff) renderDiff($("diff"), C.runs, C.diff, $("only-diff").checked);
}

// One chart: a metric picker, its own log-y box, a remove button, one trace per run.
function addPanel(key) {
  if (!C.panels.length) $("panels").replaceChildren();
  const n = C.nextId++;
  const select = el(
    "select",
    { "aria-label": "metric", class: "panel-key" },
    ...C.keys.map((k) => el("option", { value: k }, k)),
  );
  const box = el("input", { type: "checkbox", class: "panel-log" }),
    note = el("span", { class: "log-note" });
  const div = el("div", { id: "chart-" + n, class: "chart" });
  const remove = el("button", { class: "panel-remove", title: "remove this chart" }, "×");
  const card = el(
    "div",
    { class: "card panel" },
    el("h3", {}, select, el("label", { class: "muted" }, box, " log y ", note), remove),
    div,
  );
  $("panels").append(card);
  const pn = { key, select, box, div, card, series: {}, fresh: {}, buffer: new LoadBuffer() };
  if ($("log").checked) {
    box.checked = true;
    box.dataset.user = "1";
  }
  pn.chart = new LiveChart(div, {
    logEvery: true, // automatic log y only when every run's own values span the decades (a healthy one would flatten)
    smoothing: () => Number($("smoothing").value),
    empty: "None of these runs logged this metric.",
    log: () => (box.dataset.user ? box.checked : null),
    redraw: () => render(pn),
    onAxis: (y) => {
      box.checked = y.log;
      note.textContent = y.auto
        ? `(auto: ${Math.floor(y.decades)} decades)`
        : y.clipped
          ? "(fitted to the runs in range)"
          : "";
    },
  });
  pn.flush = throttle(() => flushPanel(pn), 200);
  select.value = key;
  select.addEventListener("change", () => {
    pn.key = select.value;
    draw(pn);
  });
  box.addEventListener("change", () => {
    box.dataset.user = "1";
    render(pn);
  });
  remove.addEventListener("click", () => {
    C.panels.splice(C.panels.indexOf(pn), 1);
    Plotly.purge(div);
    card.remove();
    syncUrl();
  });
  C.panels.push(pn);
  draw(pn);
  return pn;
}

const entries = (pn) =>
  C.runs
    .filter((r) => pn.series[r.id])
    .map((r) => ({ label: label(r), color: colorFor(r.id), series: shown(pn.series[r.id]), t0: t0Of(r) }));
// Per-run normalisation (the toolbar's box): each run's series over its first value, for runs on different scales.
const shown = (s) => ($("normalise").checked ? normalised(s) : s);

// Alert lines in each run's colour, one per incident's key step (named on hover); off the step axis,
// at the wall time of the nearest point.
function alertLines(pn) {
  const out = [];
  for (const r of C.runs) {
    const s = pn.series[r.id];
    for (const a of keySteps(C.alerts[r.id] || [])) {
      let x = a.step;
      if (xMode() !== "step") {
        if (!s?.steps.length) continue;
        const i = nearestIndex(s.steps, a.step);
        x = xMode() === "wall" ? new Date(s.walls[i] * 1000) : s.walls[i] - t0Of(r);
      }
      out.push({ x, color: colorFor(r.id), label: "▾", text: `${label(r)}: ${kindTitle(a.kind)} at step ${a.step}` });
    }
  }
  return out;
}

function render(pn) {
  pn.chart.setAlertLines(alertLines(pn), false);
  pn.chart.render(entries(pn), xMode());
}

async function draw(pn) {
  pn.buffer.start();
  const key = pn.key;
  const fetched = await Promise.all(
    C.runs.map(async (r) => {
      try {
        return [r.id, await fetchSeries(r.id, key)];
      } catch {
        return [r.id, null];
      } // this run never logged the key
    }),
  );
  if (key !== pn.key) return; // the picker changed while fetching; the newer draw wins
  pn.series = Object.fromEntries(fetched.filter(([, s]) => s));
  render(pn);
  syncUrl();
  pn.buffer.end((r, msg) => onPanelPoints(pn, r, msg));
}

// One compared run's live messages, by type.
const onLive = (r) =>
  byType({
    resync: () => {
      for (const pn of C.panels) draw(pn); // the page fell behind
    },
    points(msg) {
      for (const pn of C.panels) onPanelPoints(pn, r, msg);
      if (!C.panels.length) refreshKeys(); // a run that had logged nothing yet: its charts come with its data
      refreshLosses();
    },
    alert(msg) {
      C.alerts[r.id] ??= [];
      upsert(C.alerts[r.id], msg.alert);
      for (const pn of C.panels) if (!pn.buffer.loading) pn.chart.setAlertLines(alertLines(pn));
      renderTables();
    },
    run(msg) {
      Object.assign(r, msg.run);
      renderTables();
    },
  });

// Live: a compared run's new points of the panel's metric are appended, the same way as on the run
// page (lib/series.js appendPoints); out-of-order points make the panel refetch.
function onPanelPoints(pn, r, msg) {
  if (pn.buffer.hold(r, msg)) return;
  const pts = msg.series[pn.key];
  if (!pts) return;
  pn.series[r.id] ??= { steps: [], values: [], walls: [] };
  const s = pn.series[r.id];
  const { from, late } = appendPoints(s, pts);
  if (late) {
    draw(pn);
    return;
  }
  if (from !== undefined && pn.fresh[label(r)] === undefined) pn.fresh[label(r)] = from;
  pn.flush();
}

function flushPanel(pn) {
  const fresh = pn.fresh;
  pn.fresh = {};
  let compacted = false; // the run page's budget: long live series fold back with the envelope
  for (const id of Object.keys(pn.series)) {
    const folded = foldIfLong(pn.series[id]);
    if (folded !== pn.series[id]) {
      pn.series[id] = folded;
      compacted = true;
    }
  }
  if (compacted) render(pn);
  else pn.chart.extend(entries(pn), fresh, xMode());
}

const redrawAll = () => {
  for (const pn of C.panels) render(pn);
  syncUrl();
};
$("x-mode").addEventListener("change", () => {
  const x = $("x-mode").value;
  if (SWEEP) return; // compare_groups.js has its own listener
  if (TIME_AXES.includes(x)) return redrawAll();
  // Another metric as x (tokens, samples, epoch): the server aligns the runs on it (compare_groups.js).
  const p = new URLSearchParams({ ids: C.runs.map((r) => r.id).join(","), group: "", x, band: "none" });
  p.set("key", C.panels[0]?.key || "loss");
  location.href = "/compare?" + p;
});
$("smoothing").addEventListener("change", redrawAll);
$("smoothing").addEventListener("input", () => {
  $("smoothing-value").textContent = Number($("smoothing").value).toFixed(2);
});
$("log").addEventListener("change", () => {
  // Ticked: log on every chart. Unticked: each chart back to its own choice (auto: log past 3 decades).
  for (const pn of C.panels) {
    if ($("log").checked) {
      pn.box.checked = true;
      pn.box.dataset.user = "1";
    } else delete pn.box.dataset.user;
  }
  redrawAll();
});
$("normalise").addEventListener("change", redrawAll);
$("only-diff").addEventListener("change", renderTables);
$("add-chart").addEventListener("click", () => {
  const shown = new Set(C.panels.map((pn) => pn.key));
  addPanel(C.keys.find((k) => !shown.has(k) && !perLayer(k)) || C.keys[0]);
  syncUrl();
});
$("share").addEventListener("click", async () => {
  syncUrl();
  try {
    await navigator.clipboard.writeText(location.href);
    $("share").textContent = "Link copied";
  } catch {
    prompt("Share this link", location.href);
  }
});
if (SWEEP) sweepView(params, $);
else if (IDS.length) load();
else $("panels").replaceChildren(el("p", { class: "muted" }, "Pick runs to compare on the runs list."));
