// The per-layer signals beside the gradient heatmap: update/weight ratio and module output RMS
// (recorded by run.watch(model, optimizer): gradwatch/layer_signals.py), and the host's system metrics.
import { KEYS } from "../../lib/contract.js";
import { el } from "../../lib/dom.js";
import { LiveHeatmap } from "../../lib/heatmap.js";

const PANELS = [
  {
    key: KEYS.UPDATE_VECTOR,
    title: "Per-layer update/weight ratio ‖Δw‖/‖w‖ (log10)",
    legend: "healthy ~10⁻³ to 10⁻²; a rise towards 10⁻¹ comes before a divergence",
    opts: {
      what: "ratio",
      name: "update/weight ratios",
      empty: "No update ratios yet. run.watch(model, optimizer) records them at each optimizer step.",
    },
  },
  {
    key: KEYS.ACT_VECTOR,
    title: "Per-module output RMS (log10, forward order)",
    legend: "growing outputs (logits, attention) precede instability · red ×: NaN/inf",
    opts: {
      what: "RMS",
      name: "module output RMS values",
      empty: "No output RMS yet. run.watch(model, optimizer) records them at each optimizer step.",
    },
  },
];
const REFRESH_MS = 3000; // live: at most one re-fetch of each panel per 3 s, driven by the gradient pushes

// Adds the panels after the gradient heatmap's card and follows it: when it loads (page load, zoom,
// reset) they load the same range, and its live pushes schedule a throttled re-fetch of theirs.
export function mountSignals(heat, runId) {
  const anchor = heat.div.closest(".card");
  if (!anchor) return [];
  const panels = [];
  let after = anchor;
  for (const p of PANELS) {
    const div = el("div", { id: "heatmap-" + p.key, class: "chart" });
    const card = el(
      "div",
      { class: "card wide", "data-signal": p.key },
      el("h3", {}, p.title, " ", el("span", { class: "muted legend" }, p.legend)),
      div,
    );
    after.after(card);
    after = card;
    panels.push(new LiveHeatmap(div, runId, p.key, heat.maxCols, p.opts));
  }
  const load = heat.load.bind(heat);
  heat.load = (range) => {
    for (const panel of panels) {
      panel.zoomed = range || null;
      panel.load(range);
    }
    return load(range);
  };
  let timer = null;
  const append = heat.append.bind(heat);
  heat.append = (push) => {
    append(push);
    if (timer || heat.zoomed) return;
    timer = setTimeout(() => {
      timer = null;
      for (const panel of panels) if (!panel.zoomed && !panel.buffer.loading) panel.load();
    }, REFRESH_MS);
  };
  return panels;
}
