// The run page's memory breakdown: parameters, gradients, optimizer state and the rest, from the
// latest point of each memory key the page holds.
import { el, fmtBytes } from "./common.js";

const MEMORY_PARTS = [
  ["parameters", "memory/params"],
  ["gradients", "memory/grads"],
  ["optimizer state", "memory/optimizer_state"],
];
export const MEMORY_KEYS = MEMORY_PARTS.map(([, k]) => k);

export function renderMemoryBreakdown(box, series) {
  const last = (k) => {
    const s = series[k];
    return s?.values.length ? s.values[s.values.length - 1] : null;
  };
  const parts = MEMORY_PARTS.map(([name, k]) => [name, last(k)]);
  const total = last("memory/cuda_allocated") ?? last("memory/rss");
  if (parts.every(([, v]) => v === null)) {
    box.replaceChildren();
    return;
  }
  const known = parts.reduce((a, [, v]) => a + (v || 0), 0);
  if (total !== null)
    parts.push([
      series["memory/cuda_allocated"] ? "activations, cache & rest" : "rest of the process",
      Math.max(0, total - known),
    ]);
  box.replaceChildren(
    el("table", {}, ...parts.map(([n, v]) => el("tr", {}, el("td", {}, n), el("td", {}, fmtBytes(v))))),
  );
}
