// The run page's automatic metric charts: one per key the script logs, in a section per prefix.
import { isLossKey, isLrKey, isSystemKey, KEYS } from "../../lib/contract.js";
import { el } from "../../lib/dom.js";

const LAYER_SIGNALS = [KEYS.UPDATE_VECTOR, KEYS.ACT_VECTOR].map((v) => v + "/"); // per-layer signals: heatmaps

// Keys with a chart of their own elsewhere on the page: the losses (all on the Loss chart), the hook's
// gradient norms (global and per layer), learning rates and memory.
export const isMetric = (k) =>
  !isLossKey(k) &&
  !k.startsWith(KEYS.GRAD_PREFIX) &&
  !isLrKey(k) &&
  !k.startsWith(KEYS.MEMORY_PREFIX) &&
  !LAYER_SIGNALS.some((p) => k.startsWith(p)) && // (signals.js)
  !(k.startsWith(KEYS.SIGNALS_PREFIX) && k.endsWith("_argmax"));

// Hugging Face's bookkeeping (run time, throughput, FLOPs, epoch, tokens seen): not how training
// goes, so it waits in a collapsed section instead of adding a dozen charts above the config.
const BOOKKEEPING =
  /(^|\/)(epoch|total_flos|num_input_tokens_seen|(train|eval|test|predict)_runtime|[a-z_]*_per_second)$/;
export const isBookkeeping = (k) => BOOKKEEPING.test(k);
const BOOK = "\u0000bookkeeping"; // no real prefix (the part of a key before "/") can be this

const prefixOf = (k) => (isBookkeeping(k) ? BOOK : k.includes("/") ? k.slice(0, k.indexOf("/")) : "");

// The hook's own keys (perf/, signals/, system/, amp/) go to the performance and system section, below
// the gradient diagnostics; the script's own keys come right after the training charts.
export const isHookMetric = (k) => isSystemKey(k);

// The grid of a key's prefix section ("val", "train"; unprefixed keys first, as "metrics"),
// created in alphabetical place when the first key of that prefix shows up (live, too).
export function metricSection(container, key) {
  const prefix = prefixOf(key);
  container.querySelector(":scope > .empty-section")?.remove(); // "no metrics yet"
  for (const sec of container.children) if (sec.dataset.prefix === prefix) return sec.querySelector(".grid");
  const grid = el("div", { class: "grid" });
  const sec =
    prefix === BOOK
      ? el(
          "details",
          { class: "metric-section bookkeeping", "data-prefix": prefix },
          el("summary", {}, "bookkeeping (run time, throughput, FLOPs, epoch)"),
          grid,
        )
      : el(
          "section",
          { class: "metric-section", "data-prefix": prefix },
          el("h2", {}, prefix ? prefix + "/" : "metrics"),
          grid,
        );
  // Charts drawn while collapsed have no size: fit them when the section opens.
  if (prefix === BOOK)
    sec.addEventListener("toggle", () => {
      for (const c of sec.querySelectorAll(".js-plotly-plot")) Plotly.Plots.resize(c);
    });
  // Prefix sections in alphabetical order, the bookkeeping one always last.
  const after =
    prefix === BOOK
      ? null
      : [...container.children].find((s) => s.dataset.prefix === BOOK || s.dataset.prefix > prefix);
  container.insertBefore(sec, after || null);
  return grid;
}

// A chart's title: the script's own keys as it named them; the hook's own in words ("perf/step_time":
// "Step time"), the key beside it, muted.
function titleOf(key) {
  if (!isHookMetric(key)) return [key];
  const words = key.slice(key.lastIndexOf("/") + 1).replace(/_/g, " ");
  return [words.charAt(0).toUpperCase() + words.slice(1), " ", el("span", { class: "muted key-name" }, key)];
}

// One card: title, CSV link, log-y box and the chart's div; cards keep key order within a section.
export function metricCard(key, runId) {
  const box = el("input", { type: "checkbox" }),
    note = el("span", { class: "log-note" });
  const chart = el("div", { class: "chart", id: "metric-" + key });
  const root = el(
    "div",
    { class: "card metric", "data-key": key },
    el(
      "h3",
      {},
      ...titleOf(key),
      " ",
      el("a", { class: "csv", href: `/api/runs/${runId}/series.csv?key=${encodeURIComponent(key)}` }, "CSV"),
      " ",
      el("label", { class: "muted ylog" }, box, " log y ", note),
    ),
    chart,
  );
  return { root, chart, box, note };
}
