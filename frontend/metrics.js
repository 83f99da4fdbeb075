// The run page's automatic metric charts: one per key the script logs, in a section per prefix.
import { el } from "./common.js";

// Keys with a chart of their own elsewhere on the page: the loss chart's main key, the hook's
// gradient norms (global and per layer), learning rates and memory.
export const isMetric = (k) =>
  k !== "loss" && !k.startsWith("grad/") && k !== "lr" && !k.startsWith("lr/") && !k.startsWith("memory/");

const prefixOf = (k) => (k.includes("/") ? k.slice(0, k.indexOf("/")) : "");

// The grid of a key's prefix section ("val", "train"; unprefixed keys first, as "metrics"),
// created in alphabetical place when the first key of that prefix shows up (live, too).
export function metricSection(container, key) {
  const prefix = prefixOf(key);
  for (const sec of container.children) if (sec.dataset.prefix === prefix) return sec.querySelector(".grid");
  const grid = el("div", { class: "grid" });
  const sec = el(
    "section",
    { class: "metric-section", "data-prefix": prefix },
    el("h2", {}, prefix ? prefix + "/" : "metrics"),
    grid,
  );
  const after = [...container.children].find((s) => s.dataset.prefix > prefix);
  container.insertBefore(sec, after || null);
  return grid;
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
      key,
      " ",
      el("a", { class: "csv", href: `/api/runs/${runId}/series.csv?key=${encodeURIComponent(key)}` }, "CSV"),
      " ",
      el("label", { class: "muted ylog" }, box, " log y ", note),
    ),
    chart,
  );
  return { root, chart, box, note };
}
