// Which section of a run's page a key belongs to, in the order the run and compare pages show them:
// training (losses, gradient norm, learning rate), the script's own metrics, gradient diagnostics
// (per layer), then performance, system and signals (the hook's own families).
import { isLossKey, isLrKey, isSystemKey, KEYS, VECTORS } from "./contract.js";

export const SECTION_ORDER = ["training", "metrics", "gradients", "system"];
const NORMS = [KEYS.GLOBAL_NORM, KEYS.GLOBAL_NORM_CLIPPED];
const PER_LAYER = [KEYS.GRAD_PREFIX, ...VECTORS.map((v) => v + "/")];

export function sectionOf(key) {
  if (isLossKey(key) || isLrKey(key) || NORMS.includes(key)) return "training";
  if (PER_LAYER.some((p) => key.startsWith(p))) return "gradients";
  if (isSystemKey(key)) return "system";
  return "metrics";
}

// Keys in page order: by section, then the main loss first, the norm before the LR, then by name.
export function bySection(a, b) {
  const rank = (k) =>
    SECTION_ORDER.indexOf(sectionOf(k)) * 10 +
    (k === "loss" ? 0 : isLossKey(k) ? 1 : NORMS.includes(k) ? 2 : isLrKey(k) ? 3 : 4);
  return rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0);
}

// A per-layer key (grad/<layer>, act_rms/<module>...): a chart of its own only when asked for.
export const isPerLayer = (key) => sectionOf(key) === "gradients";
