// The run page's memory breakdown: parameters, gradients, optimizer state and the rest, from the
// latest point of each memory key the page holds.
import { KEYS } from "../../lib/contract.js";
import { el } from "../../lib/dom.js";
import { fmtBytes } from "../../lib/format.js";

const MEMORY_PARTS = [
  ["parameters", KEYS.PARAMS_BYTES],
  ["gradients", KEYS.GRADS_BYTES],
  ["optimizer state", KEYS.OPTIMIZER_STATE_BYTES],
];
export const MEMORY_KEYS = MEMORY_PARTS.map(([, k]) => k);

export function renderMemoryBreakdown(box, series) {
  const last = (k) => {
    const s = series[k];
    return s?.values.length ? s.values[s.values.length - 1] : null;
  };
  const parts = MEMORY_PARTS.map(([name, k]) => [name, last(k)]);
  const total = last(KEYS.CUDA_ALLOCATED) ?? last(KEYS.RSS);
  if (parts.every(([, v]) => v === null)) {
    box.replaceChildren();
    return;
  }
  const known = parts.reduce((a, [, v]) => a + (v || 0), 0);
  if (total !== null)
    parts.push([
      series[KEYS.CUDA_ALLOCATED] ? "activations, cache & rest" : "rest of the process",
      Math.max(0, total - known),
    ]);
  box.replaceChildren(
    el("table", {}, ...parts.map(([n, v]) => el("tr", {}, el("td", {}, n), el("td", {}, fmtBytes(v))))),
  );
}
