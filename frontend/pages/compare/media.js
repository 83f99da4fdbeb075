// Compare's media section: for one histogram or image key (a picker), each run's view side by side,
// all at one shared step slider (each run shows what it logged last at or before the chosen step).
// The views themselves are the run page's (lib/media.js).

import { turns } from "../../lib/fetch.js";
import {
  drawHistogramHeatmap,
  drawHistogramStep,
  fetchHistograms,
  fetchImages,
  imagesRow,
  json,
  markHistogramStep,
  node,
  slider,
  stepAtOrBefore,
  valueRange,
} from "../../lib/media.js";
import { colorFor } from "../../lib/plot.js";

const KINDS = ["histogram", "image"];

// Mounts the section in `box` (hidden when no compared run logged histograms or images).
export async function mountCompareMedia(box, runs) {
  const lists = await Promise.all(runs.map((r) => json(`/api/runs/${r.id}/media`).catch(() => [])));
  const keys = new Map(); // key -> kind, in the order the runs list them
  for (const list of lists)
    for (const m of list) if (KINDS.includes(m.kind) && !keys.has(m.key)) keys.set(m.key, m.kind);
  box.hidden = !keys.size;
  if (!keys.size) return;
  const picker = node("select", { "aria-label": "media key", class: "media-key" });
  for (const [key, kind] of keys) picker.append(node("option", { value: key }, `${key} (${kind})`));
  const body = node("div", { class: "compare-media-body" });
  box.replaceChildren(
    node(
      "h2",
      {},
      "Media side by side ",
      node("span", { class: "muted" }, "histograms and images, one step for all runs"),
    ),
    node("div", { class: "toolbar" }, node("label", {}, "key ", picker)),
    body,
  );
  const turn = turns(); // a slower, earlier pick must not replace what a later one shows
  const show = () => showKey(body, runs, lists, picker.value, keys.get(picker.value), turn());
  picker.addEventListener("change", show);
  await show();
}

// One column per run that logged `key`; the slider runs over every step any of them logged it at.
// Nothing is drawn unless `latest()` still holds once the columns' data is in.
async function showKey(body, runs, lists, key, kind, latest) {
  const having = runs.filter((_, i) => lists[i].some((m) => m.key === key));
  const views = await Promise.all(having.map((r) => (kind === "histogram" ? histogramColumn : imageColumn)(r, key)));
  if (!latest()) return;
  // Histograms on one value axis, so the runs' distributions line up across the columns.
  const all = views.flatMap((v) => v.hs || []),
    values = all.length ? valueRange(all) : null;
  for (const v of views) v.draw?.(values);
  const steps = [...new Set(views.flatMap((v) => v.steps))].sort((a, b) => a - b);
  const s = slider(steps, (step) => {
    for (const v of views) v.at(step);
  });
  body.replaceChildren(s.el, node("div", { class: "compare-media-grid" }, ...views.map((v) => v.el)));
  s.pick();
}

function column(run, kind) {
  const head = node(
    "h3",
    {},
    node("span", { class: "swatch", style: "background:" + colorFor(run.id) }),
    node("a", { href: "/runs/" + run.id }, run.name),
    ` #${run.id} `,
    node("span", { class: "muted shown-step" }),
  );
  return node("div", { class: "card compare-media-run", "data-run": run.id, "data-kind": kind }, head);
}

// Says which step a run shows (or that it had logged nothing by then).
function shownStep(el, step, chosen) {
  el.dataset.step = step ?? "";
  el.querySelector(".shown-step").textContent = step === null ? `nothing at or before step ${chosen}` : `step ${step}`;
}

async function histogramColumn(run, key) {
  const hs = await fetchHistograms(run.id, key);
  const el = column(run, "histogram");
  const heat = node("div", { class: "chart histogram-heatmap" });
  const counts = node("div", { class: "muted nonfinite" });
  const bars = node("div", { class: "chart histogram-bars" });
  el.append(heat, counts, bars);
  const steps = hs.map((h) => h.step);
  let range = null;
  const draw = (values) => {
    range = values;
    if (hs.length) drawHistogramHeatmap(heat, hs, { values, at: steps[steps.length - 1] });
  };
  const at = (chosen) => {
    const step = stepAtOrBefore(steps, chosen);
    shownStep(el, step, chosen);
    markHistogramStep(heat, step);
    if (step === null) {
      counts.textContent = "";
      bars.replaceChildren();
    } else drawHistogramStep(bars, counts, hs[steps.indexOf(step)], { values: range });
  };
  return { el, steps, hs, draw, at };
}

async function imageColumn(run, key) {
  const first = await fetchImages(run.id, key);
  const el = column(run, "image");
  const imgs = node("div", { class: "media-body" });
  el.append(imgs);
  const turn = turns();
  const at = async (chosen) => {
    const step = stepAtOrBefore(first.steps, chosen),
      mine = turn();
    if (step === null) {
      imgs.replaceChildren();
      return shownStep(el, null, chosen);
    }
    const got = step === first.step ? first : await fetchImages(run.id, key, step);
    if (!mine()) return; // the slider moved on meanwhile
    imgs.replaceChildren(imagesRow(run.id, got));
    shownStep(el, got.step, chosen);
  };
  return { el, steps: first.steps, at };
}
