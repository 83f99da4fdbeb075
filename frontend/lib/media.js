// Media views shared by the run page's media panel and compare's side-by-side section: a step slider,
// a histogram key as a bins x steps heatmap and one step's bars (with its NaN/inf counts), the images
// of a key at a step. User text (captions, keys) is always rendered with textContent.

import { plotLayout } from "./plot.js";
import { whenPlotly } from "./plotly_load.js";

export const node = (tag, attrs = {}, ...children) => {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") n.className = v;
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) n.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) n.append(c instanceof Node ? c : String(c));
  return n;
};
export const json = async (url) => {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${r.status} ${url}`);
  return r.json();
};
const q = (key) => encodeURIComponent(key);
const ROWS = 48; // heatmap rows: every step's bins resampled onto one value grid

// A step slider over `steps` (starting at the last); pick() calls onPick with the chosen step.
export function slider(steps, onPick) {
  const label = node("span", { class: "muted step-label" });
  const input = node("input", { type: "range", min: 0, max: Math.max(0, steps.length - 1), value: steps.length - 1 });
  const pick = () => {
    label.textContent = `step ${steps[Number(input.value)]}`;
    onPick(steps[Number(input.value)]);
  };
  input.addEventListener("input", pick);
  return { el: node("label", { class: "media-slider" }, "step ", input, " ", label), pick, input };
}

// The last of sorted `steps` at or before `step`, else null (nothing logged yet by then).
export function stepAtOrBefore(steps, step) {
  let found = null;
  for (const s of steps) if (s <= step) found = s;
  return found;
}

// One histogram key of a run over steps, as the API sends it: [{step, counts, lo, hi | edges, nan, inf, ninf}].
export const fetchHistograms = async (runId, key) =>
  (await json(`/api/runs/${runId}/histograms?key=${q(key)}&max_steps=400`)).histograms;

// The images of a key at a step (the last logged at or before it) and every step it has.
export const fetchImages = (runId, key, step) =>
  json(`/api/runs/${runId}/images?key=${q(key)}${step === undefined ? "" : "&step=" + step}`);

// Bins of one histogram as (centre, count) pairs, from its lo/hi (even bins) or its edges.
function bins(h) {
  const n = h.counts.length;
  const edges = h.edges || Array.from({ length: n + 1 }, (_, i) => h.lo + ((h.hi - h.lo) * i) / n);
  return h.counts.map((c, i) => [(edges[i] + edges[i + 1]) / 2, c, edges[i], edges[i + 1]]);
}

// The values every histogram of hs covers, [lo, hi].
export const valueRange = (hs) => [
  Math.min(...hs.map((h) => (h.edges ? h.edges[0] : h.lo))),
  Math.max(...hs.map((h) => (h.edges ? h.edges[h.edges.length - 1] : h.hi))),
];

// Every step's bins on one value grid: the heatmap's x (steps), y (bin centres) and z (counts).
function grid(hs) {
  const [lo, hi] = valueRange(hs);
  const width = hi > lo ? (hi - lo) / ROWS : 1;
  const ys = Array.from({ length: ROWS }, (_, i) => lo + width * (i + 0.5));
  const z = ys.map(() => hs.map(() => 0));
  hs.forEach((h, col) => {
    for (const [centre, count] of bins(h)) {
      const row = Math.min(ROWS - 1, Math.max(0, Math.floor((centre - lo) / width)));
      z[row][col] += count;
    }
  });
  return { steps: hs.map((h) => h.step), ys, z };
}

// The distribution over steps (log10(1 + count) per cell); `values` fixes the value axis (compare: the
// same for every run) and `at` marks a step with a line.
export async function drawHistogramHeatmap(div, hs, { values, at } = {}) {
  const Plotly = await whenPlotly(); // the run page runs it after its first charts (plotly_load.js)
  const { steps, ys, z } = grid(hs);
  Plotly.newPlot(
    div,
    [{ type: "heatmap", x: steps, y: ys, z: z.map((r) => r.map((c) => (c ? Math.log10(1 + c) : null))) }],
    plotLayout({
      margin: { t: 10, r: 10, b: 36, l: 50 },
      height: 240,
      showlegend: false,
      hovermode: "closest",
      xaxis: Object.assign(plotLayout().xaxis, { title: { text: "step" } }),
      yaxis: Object.assign(plotLayout().yaxis, values ? { range: values } : {}),
      shapes: at === undefined || at === null ? [] : [stepLine(at)],
    }),
    { displaylogo: false, responsive: true },
  );
}

// The chosen step on a heatmap: a dotted line in the text colour (light or dark).
const stepLine = (x) => ({
  type: "line",
  xref: "x",
  yref: "paper",
  x0: x,
  x1: x,
  y0: 0,
  y1: 1,
  line: { width: 2, dash: "dot", color: plotLayout().font.color },
});

// Moves the step line of a heatmap drawn with `at`.
export const markHistogramStep = (div, step) =>
  div.layout && whenPlotly().then((Plotly) => Plotly.relayout(div, { shapes: step === null ? [] : [stepLine(step)] }));

// One step's histogram as bars, its NaN/inf counts written in `counts`; `values` fixes the value axis.
export async function drawHistogramStep(bars, counts, h, { values } = {}) {
  counts.textContent = `step ${h.step}: NaN ${h.nan} · +inf ${h.inf} · -inf ${h.ninf}`;
  counts.dataset.nan = h.nan;
  const Plotly = await whenPlotly();
  const b = bins(h);
  Plotly.react(
    bars,
    [{ type: "bar", x: b.map((v) => v[0]), y: b.map((v) => v[1]), marker: { color: "#3b5bdb" } }],
    plotLayout({
      margin: { t: 10, r: 10, b: 30, l: 40 },
      height: 180,
      bargap: 0,
      showlegend: false,
      hovermode: "closest",
      xaxis: Object.assign(plotLayout().xaxis, values ? { range: values } : {}),
    }),
    { displaylogo: false, responsive: true },
  );
}

// The images fetched for one step (fetchImages), captions below, served through their run.
export function imagesRow(runId, got) {
  const row = node("div", { class: "media-images" });
  for (const im of got.images) {
    const fig = node("figure", {});
    fig.append(
      node("img", {
        src: `/api/runs/${runId}/images/${im.id}.png`,
        width: im.width,
        height: im.height,
        alt: im.caption || "",
      }),
    );
    if (im.caption) fig.append(node("figcaption", {}, im.caption));
    row.append(fig);
  }
  return row;
}
