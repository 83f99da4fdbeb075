// The run page's x axis beyond step, wall and relative time: any scalar key the run logs (tokens,
// samples, epoch). Aligned by step on the server by the compare page's aligner (/api/compare/series
// for this one run), not a second aligner here.
import { KEYS, num, TIME_AXES as TIME } from "../../lib/contract.js";
import { getJSON } from "../../lib/fetch.js";
import { nearestIndex } from "../../lib/series.js";

const POINTS = 2000;

// The key a mode plots against ("tokens"), or null for step, wall and relative time.
export const xKeyOf = (mode) => (TIME.includes(mode) ? null : mode);

// The axis a metric's chart is drawn on: on the page's step axis, the key's own define_metric step_metric
// (the run's `defined_metrics`, resolved by the server) when it has one; otherwise the page's axis.
export function axisOf(pageMode, run, key) {
  const own = key ? run?.defined_metrics?.[key]?.step_metric : null;
  return pageMode === "step" && own && own !== key ? own : pageMode;
}

// A series against another key's values, joined by step (W&B's step_metric): each point's x is the x key's
// value at that step, or at its latest step before (a value logged once per epoch holds until the next).
export function joinByStep(series, xSeries) {
  const steps = [],
    values = [];
  const xs = xSeries?.steps || [];
  let j = -1;
  series.steps.forEach((s, i) => {
    while (j + 1 < xs.length && xs[j + 1] <= s) j++;
    if (j >= 0) {
      steps.push(xSeries.values[j]);
      values.push(series.values[i]);
    }
  });
  return { steps, values, walls: [] };
}

// One option per scalar key, added as keys show up (live too); the select keeps the user's choice.
export function offerKeys(select, keys) {
  const have = new Set([...select.options].map((o) => o.value));
  for (const k of keys) if (!have.has(k) && !k.startsWith(KEYS.GRAD_PREFIX)) select.append(new Option(k, k));
}

// One key's values against another key's, as a series whose steps are the x key's values.
export async function seriesAgainst(runId, key, xKey) {
  const q = new URLSearchParams({ ids: String(runId), key, x: xKey, points: String(POINTS), band: "none" });
  let d;
  try {
    d = await getJSON(`/api/compare/series?${q}`);
  } catch {
    return { steps: [], values: [], walls: [] }; // a key that cannot be read: an empty chart, not a broken page
  }
  const g = d.groups[0],
    steps = [],
    values = [];
  if (g)
    d.xs.forEach((x, i) => {
      if (x !== null && g.y[i] !== null) {
        steps.push(num(x));
        values.push(num(g.y[i]));
      }
    });
  return { steps, values, walls: [] };
}

// The x key's value at a step (alert lines), from the series the page holds; null when it has none.
export function xAt(series, step) {
  const i = nearestIndex(series?.steps, step);
  return i < 0 ? null : series.values[i];
}
