// The compare page for a sweep: `/compare?project=P&where=...&group=<config key>` (or `ids=` with `group=`).
// One request (/api/compare/series) gives every run's series aligned on the server; one line per group
// (mean or median) with a band (std, standard error or min-max) and the run count in the legend. Colours by
// group (at most 10 distinct hues), or a sequential scale over a numeric config value. Parallel coordinates
// of the config keys that vary against a metric's summary (min, max, last or at the best step); brushing an
// axis filters the runs table under it. Numbers in the one format (fmtNumber): lr = 1e-4, +inf.
import { flatten } from "../../lib/config.js";
import { AGGREGATIONS, BANDS, isLossKey, num, parseColumn, TIME_AXES } from "../../lib/contract.js";
import { el } from "../../lib/dom.js";
import { getJSON, turns } from "../../lib/fetch.js";
import { esc, fmtNumber } from "../../lib/format.js";
import { plotLayout } from "../../lib/plot.js";

const CATEGORICAL = [
  "#4e79a7",
  "#f28e2b",
  "#e15759",
  "#76b7b2",
  "#59a14f",
  "#edc948",
  "#b07aa1",
  "#ff9da7",
  "#9c755f",
  "#bab0ac",
];
// Viridis stops: a sequential scale that reads in order (and in grey) for many groups or a numeric key.
const VIRIDIS = ["#440154", "#414487", "#2a788e", "#22a884", "#7ad151", "#fde725"];

function sequential(t) {
  const x = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1),
    i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const mix = (a, b, f) => Math.round(a + (b - a) * f);
  const rgb = (h) => [1, 3, 5].map((k) => parseInt(h.slice(k, k + 2), 16));
  const [a, b] = [rgb(VIRIDIS[i]), rgb(VIRIDIS[i + 1])];
  return `rgb(${mix(a[0], b[0], x - i)},${mix(a[1], b[1], x - i)},${mix(a[2], b[2], x - i)})`;
}

// The colour of each group: categorical for up to 10 non-numeric groups, otherwise sequential by order.
export function groupColors(groups, mode) {
  const numeric = groups.every((g) => typeof g.value === "number");
  if (mode !== "sequential" && groups.length <= CATEGORICAL.length && !(mode === "auto" && numeric))
    return groups.map((_, i) => CATEGORICAL[i]);
  const values = numeric ? groups.map((g) => Math.log10(Math.abs(g.value) || 1e-12)) : groups.map((_, i) => i);
  const lo = Math.min(...values),
    hi = Math.max(...values);
  return values.map((v) => sequential(hi > lo ? (v - lo) / (hi - lo) : 0.5));
}

const alpha = (color, a) =>
  color.startsWith("#")
    ? `rgba(${[1, 3, 5].map((k) => parseInt(color.slice(k, k + 2), 16)).join(",")},${a})`
    : color.replace("rgb(", "rgba(").replace(")", `,${a})`);

export function traces(data, colors) {
  const xs = data.xs.map((v) => (v === null ? null : num(v)));
  const x = data.x === "wall" ? xs.map((v) => (v === null ? null : new Date(v * 1000))) : xs;
  const out = [];
  data.groups.forEach((g, i) => {
    const label = typeof g.value === "number" ? fmtNumber(g.value) : g.label;
    const name = esc(`${data.group ? `${data.group} = ${label}` : label} (n=${g.count})`);
    const color = colors[i];
    if (data.band !== "none") {
      out.push({
        x,
        y: g.hi.map(num),
        mode: "lines",
        line: { width: 0 },
        showlegend: false,
        legendgroup: name,
        hoverinfo: "skip",
      });
      out.push({
        x,
        y: g.lo.map(num),
        mode: "lines",
        line: { width: 0 },
        fill: "tonexty",
        fillcolor: alpha(color, 0.18),
        showlegend: false,
        legendgroup: name,
        hoverinfo: "skip",
      });
    }
    out.push({ x, y: g.y.map(num), mode: "lines", name, legendgroup: name, line: { color, width: 2 } });
  });
  return out;
}

// The summaries a parallel-coordinates metric axis can show; "best" is the value at the step where the
// reference loss is lowest (the column grammar's at_min).
export const PC_FIELDS = ["min", "max", "last", "best"];
export const defaultField = (key) => (isLossKey(key) ? "min" : "last");
export function pcColumn(key, field, ref) {
  return field === "best" ? `summary.${key}.at_min(${ref})` : `summary.${key}.${field}`;
}

const isSeed = (k) => /seed$/i.test(k.split(/[./]/).pop());

// A numeric axis: log-spaced values (positive, spanning ≥ 100×; a 0 sits a decade below the smallest) on a
// log10 scale, ticks at the values themselves (≤ 10 of them) or at each decade, labelled in the one format.
function numericAxis(k, values) {
  const positive = values.filter((v) => v > 0);
  const lo = Math.min(...positive),
    hi = Math.max(...positive);
  const log = values.every((v) => v >= 0) && positive.length >= 2 && hi / lo >= 100;
  const distinct = [...new Set(values)].sort((a, b) => a - b);
  if (!log) {
    const ticks = distinct.length <= 10 ? { tickvals: distinct, ticktext: distinct.map(fmtNumber) } : {};
    return { label: esc(k), values, key: k, ...ticks };
  }
  const zero = Math.log10(lo) - 1;
  const at = (v) => (v > 0 ? Math.log10(v) : zero);
  const marks =
    distinct.length <= 10
      ? distinct
      : Array.from(
          { length: Math.floor(Math.log10(hi)) - Math.ceil(Math.log10(lo)) + 1 },
          (_, i) => 10 ** (Math.ceil(Math.log10(lo)) + i),
        ).concat(values.some((v) => v === 0) ? [0] : []);
  return {
    label: esc(`${k} (log)`),
    values: values.map(at),
    tickvals: marks.map(at),
    ticktext: marks.map(fmtNumber),
    key: k,
    log: true,
  };
}

// Parallel-coordinates dimensions: the config keys whose values differ (seeds only with ``seeds``; strings
// as ticks), then the metric column (``summary.<key>.<field>``).
export function dimensions(runs, metric, { seeds = false } = {}) {
  const flat = runs.map((r) => flatten(r.config || {}));
  const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))].sort().filter((k) => seeds || !isSeed(k));
  const dims = [];
  for (const k of keys) {
    const values = flat.map((f) => f[k] ?? null);
    const distinct = [...new Set(values.map((v) => JSON.stringify(v)))];
    if (distinct.length < 2) continue;
    if (values.every((v) => typeof v === "number")) {
      dims.push(numericAxis(k, values));
    } else {
      const ticks = distinct.sort();
      dims.push({
        label: esc(k),
        values: values.map((v) => ticks.indexOf(JSON.stringify(v))),
        tickvals: ticks.map((_, i) => i),
        ticktext: ticks.map((t) => esc(JSON.parse(t))),
        key: k,
      });
    }
  }
  const [, key, field] = parseColumn(metric);
  const label = field.startsWith("at_min(") ? `${key} at best ${field.slice(7, -1)}` : `${key} ${field}`;
  dims.push({ label: esc(label), values: runs.map((r) => num(r.summary?.[key]?.[field] ?? NaN)), key: metric });
  return dims;
}

const configText = (v) => (v === undefined || v === null ? "" : typeof v === "number" ? fmtNumber(v) : String(v));

export async function sweepView(params, $) {
  const S = {
    key: params.get("key") || "loss",
    group: params.get("group") || "",
    agg: params.get("agg") || AGGREGATIONS[0],
    band: params.get("band") || BANDS[0],
    color: params.get("color") || "auto",
    x: params.get("x") || TIME_AXES[0],
    project: params.get("project") || "",
    where: params.get("where") || "",
    ids: params.get("ids") || "",
    field: params.get("field") || "",
    seeds: params.get("seeds") === "1",
  };
  S.field = S.field || defaultField(S.key);
  const cols = await getJSON("/api/columns" + (S.project ? "?project=" + encodeURIComponent(S.project) : ""));
  for (const node of document.querySelectorAll(".two-col, #add-chart, #smoothing, #log"))
    node.closest("label, div, button").style.display = "none";
  const pick = (id, label, options, value) => {
    const s = el(
      "select",
      { id, "aria-label": label },
      ...options.map((o) => el("option", { value: o }, o || "(none)")),
    );
    s.value = value;
    return el("label", {}, label + " ", s);
  };
  $("x-mode").replaceChildren(...[...TIME_AXES, ...cols.summary].map((k) => el("option", { value: k }, k)));
  $("x-mode").value = S.x;
  const controls = el(
    "div",
    { class: "toolbar sweep-controls" },
    pick("g-key", "metric", cols.summary, S.key),
    pick("g-group", "group by", ["", ...cols.config], S.group),
    pick("g-agg", "line", AGGREGATIONS, S.agg),
    pick("g-band", "band", BANDS, S.band),
    pick("g-color", "colour", ["auto", "group", "sequential"], S.color),
    pick("g-field", "axis summary", PC_FIELDS, S.field),
    el("label", { title: "draw seed config keys as axes" }, el("input", { type: "checkbox", id: "g-seeds" }), " seeds"),
    el("span", { id: "g-info", class: "muted" }),
  );
  const chart = el("div", { id: "group-chart", class: "chart tall" });
  const pc = el("div", { id: "parcoords", class: "chart" });
  const table = el("table", { id: "sweep-runs" });
  $("panels").classList.remove("grid");
  $("panels").replaceChildren(
    controls,
    el("div", { class: "card" }, chart),
    el("div", { class: "card" }, el("h3", {}, "Parallel coordinates (drag on an axis to filter the runs)"), pc),
    el(
      "div",
      { class: "card" },
      el("h3", {}, "Runs ", el("span", { id: "sweep-count", class: "muted" })),
      el("div", { class: "scroll-box" }, table),
    ),
  );
  $("run-list").textContent = [S.project && `project ${S.project}`, S.where].filter(Boolean).join(" · ");

  const query = () => {
    const p = new URLSearchParams();
    for (const k of ["project", "where", "ids", "group", "key", "agg", "band", "color", "x", "field"])
      if (S[k]) p.set(k, S[k]);
    if (S.seeds) p.set("seeds", "1");
    return p;
  };
  let runs = [];

  // A draw whose data comes in after a newer pick's draws nothing (picks race).
  const chartTurn = turns(),
    pcTurn = turns();

  async function drawChart() {
    const mine = chartTurn();
    const p = query();
    p.delete("color");
    p.set("points", "200");
    const t = performance.now();
    const data = await getJSON("/api/compare/series?" + p);
    if (!mine()) return;
    const colors = groupColors(data.groups, S.color);
    const layout = plotLayout({
      xaxis: { title: { text: esc(S.x) }, type: S.x === "wall" ? "date" : "linear" },
      yaxis: { title: { text: esc(S.key) } },
      legend: { orientation: "v", x: 1.02, y: 1 },
      margin: { l: 56, r: 220, t: 8, b: 40 },
    });
    await Plotly.react(chart, traces(data, colors), layout, { displaylogo: false, responsive: true });
    chart.dataset.groups = data.groups.length;
    $("g-info").textContent =
      `${data.runs.length} runs, ${data.groups.length} lines, ${Math.round(performance.now() - t)} ms`;
  }

  // The reference loss of "at best": val/loss when the runs have it, else the metric itself.
  const bestRef = () => (cols.summary.includes("val/loss") ? "val/loss" : S.key);
  const metricColumn = () => pcColumn(S.key, S.field, bestRef());

  function renderRuns(shown, dims) {
    const metric = metricColumn(),
      [, key, field] = parseColumn(metric);
    table.replaceChildren(
      el(
        "tr",
        {},
        el("th", {}, "Run"),
        el("th", {}, S.group || "group"),
        el("th", { class: "num" }, dims[dims.length - 1].label),
      ),
      ...shown
        .slice(0, 500)
        .map((r) =>
          el(
            "tr",
            { "data-run": r.id },
            el("td", {}, el("a", { href: "/runs/" + r.id }, r.name)),
            el("td", {}, S.group ? configText(flatten(r.config || {})[S.group]) : ""),
            el("td", { class: "num" }, fmtNumber(r.summary?.[key]?.[field] ?? null)),
          ),
        ),
    );
    $("sweep-count").textContent =
      `${shown.length} of ${runs.length}` + (shown.length > 500 ? " (first 500 shown)" : "");
    table.dataset.metric = metric;
  }

  async function drawParcoords() {
    const mine = pcTurn();
    const p = new URLSearchParams({ columns: [`summary.${S.key}`, metricColumn()].join(",") });
    if (S.project) p.set("project", S.project);
    const ids = S.ids ? S.ids.split(",").filter(Boolean) : [];
    const where = [S.where && `(${S.where})`, ids.length && ids.length <= 200 && `id in [${ids.join(",")}]`];
    if (where.some(Boolean)) p.set("where", where.filter(Boolean).join(" and "));
    const got = await getJSON("/api/runs?" + p);
    if (!mine()) return;
    runs = got;
    if (S.ids) {
      const ids = new Set(S.ids.split(",").map(Number));
      runs = runs.filter((r) => ids.has(r.id));
    }
    const dims = dimensions(runs, metricColumn(), { seeds: S.seeds });
    const color = dims[dims.length - 1].values;
    await Plotly.react(
      pc,
      [{ type: "parcoords", dimensions: dims, line: { color, colorscale: "Viridis", showscale: true } }],
      plotLayout({ margin: { l: 80, r: 80, t: 40, b: 20 } }),
      { displaylogo: false, responsive: true },
    );
    renderRuns(runs, dims);
    pc.removeAllListeners?.("plotly_restyle");
    pc.on("plotly_restyle", () => {
      const ranges = pc.data[0].dimensions.map((d) => d.constraintrange);
      const inRange = (v, r) => {
        if (!r) return true;
        const spans = Array.isArray(r[0]) ? r : [r];
        return spans.some(([lo, hi]) => v >= lo && v <= hi);
      };
      renderRuns(
        runs.filter((_, i) => dims.every((d, k) => inRange(d.values[i], ranges[k]))),
        dims,
      );
    });
  }

  async function redraw(all) {
    history.replaceState(null, "", "/compare?" + query());
    try {
      await drawChart(); // the lines first; the parallel coordinates (WebGL) after them
      if (all) await drawParcoords();
    } catch (e) {
      $("missing").replaceChildren(el("div", { class: "alert critical", "data-kind": "load-failed" }, e.message));
    }
  }
  const bind = (id, field, all) =>
    $(id).addEventListener("change", () => {
      S[field] = $(id).value;
      redraw(all);
    });
  $("g-key").addEventListener("change", () => {
    S.key = $("g-key").value;
    S.field = defaultField(S.key); // a loss is best at its min, an accuracy read last
    $("g-field").value = S.field;
    redraw(true);
  });
  bind("g-group", "group", true);
  bind("g-agg", "agg", false);
  bind("g-band", "band", false);
  bind("g-color", "color", false);
  bind("x-mode", "x", false);
  const redrawAxes = () => {
    history.replaceState(null, "", "/compare?" + query());
    drawParcoords().catch((e) => $("missing").replaceChildren(el("div", { class: "alert critical" }, e.message)));
  };
  $("g-field").addEventListener("change", () => {
    S.field = $("g-field").value;
    redrawAxes();
  });
  $("g-seeds").checked = S.seeds;
  $("g-seeds").addEventListener("change", () => {
    S.seeds = $("g-seeds").checked;
    redrawAxes();
  });
  await redraw(true);
}
