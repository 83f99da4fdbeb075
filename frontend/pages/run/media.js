// The run page's media panel (frontend/pages/run/media.js): histograms over steps (a bins x steps heatmap and one step's bars, with
// NaN/inf counts), images and tables at a step chosen with a slider, and what the script set in run.summary.
// The shared views (slider, histogram heatmap and bars, images) are lib/media.js, also used by compare.

import { turns } from "../../lib/fetch.js";
import {
  drawHistogramHeatmap,
  drawHistogramStep,
  fetchHistograms,
  imagesRow,
  json,
  node,
  slider,
} from "../../lib/media.js";

const q = (key) => encodeURIComponent(key);

// Mounts the panel in `box` (hidden while the run has no media and no summary); returns a refresh().
export function mountMedia(box, runId) {
  const refresh = async () => {
    const [media, summary] = await Promise.all([
      json(`/api/runs/${runId}/media`).catch(() => []),
      json(`/api/runs/${runId}/summary`).catch(() => ({})),
    ]);
    box.replaceChildren();
    box.hidden = !media.length && !Object.keys(summary).length;
    if (Object.keys(summary).length) box.append(summaryCard(summary));
    for (const m of media) {
      const card = node("div", { class: "card wide media-card", "data-key": m.key, "data-kind": m.kind });
      card.append(node("h3", {}, m.key, " ", node("span", { class: "muted" }, `${m.kind} · ${m.steps} step(s)`)));
      box.append(card);
      if (m.kind === "histogram") histogramView(card, runId, m.key);
      else stepView(card, runId, m);
    }
  };
  refresh();
  return refresh;
}

function summaryCard(summary) {
  const dl = node("dl", { class: "kv", id: "run-summary" });
  for (const [k, v] of Object.entries(summary).sort()) {
    dl.append(node("dt", {}, k), node("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v)));
  }
  return node("div", { class: "card media-card" }, node("h3", {}, "Summary"), dl);
}

async function histogramView(card, runId, key) {
  const hs = await fetchHistograms(runId, key);
  if (!hs.length) return;
  const heat = node("div", { class: "chart histogram-heatmap" });
  const bars = node("div", { class: "chart histogram-bars" });
  const counts = node("div", { class: "muted nonfinite" });
  const steps = hs.map((h) => h.step);
  const s = slider(steps, (step) => drawHistogramStep(bars, counts, hs[steps.indexOf(step)]));
  card.append(heat, s.el, counts, bars);
  drawHistogramHeatmap(heat, hs);
  s.pick();
}

async function stepView(card, runId, m) {
  const path = m.kind === "image" ? "images" : "tables";
  const first = await json(`/api/runs/${runId}/${path}?key=${q(m.key)}`);
  const body = node("div", { class: "media-body" });
  const turn = turns();
  const show = async (step) => {
    const mine = turn();
    const got = await json(`/api/runs/${runId}/${path}?key=${q(m.key)}&step=${step}`);
    if (!mine()) return; // the slider moved on meanwhile: a late answer must not replace the newer step
    body.replaceChildren(m.kind === "image" ? imagesRow(runId, got) : m.kind === "table" ? table(got) : text(got));
    body.dataset.step = got.step;
  };
  const s = slider(first.steps, show);
  card.append(s.el, body);
  s.pick();
}

function text(got) {
  return node("pre", { class: "media-text" }, got.text);
}

// A table sorted by a column when its header is clicked (again: the other way).
function table(got) {
  const tbl = node("table", { class: "media-table" });
  let rows = got.rows.slice();
  let by = -1,
    dir = 1;
  const body = node("tbody");
  const draw = () => {
    body.replaceChildren(
      ...rows.map((r) =>
        node("tr", {}, ...got.columns.map((_, i) => node("td", {}, r[i] === null ? "" : String(r[i])))),
      ),
    );
  };
  const head = node(
    "tr",
    {},
    ...got.columns.map((c, i) =>
      node(
        "th",
        {
          onclick: () => {
            dir = by === i ? -dir : 1;
            by = i;
            rows = rows.slice().sort((a, b) => cmp(a[i], b[i]) * dir);
            draw();
          },
        },
        c,
      ),
    ),
  );
  tbl.append(node("thead", {}, head), body);
  draw();
  return tbl;
}

function cmp(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (a === null || a === undefined) return 1;
  if (b === null || b === undefined) return -1;
  return String(a).localeCompare(String(b));
}
