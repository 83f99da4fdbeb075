// Series as the pages hold them ({steps, values, walls}): live appends, the compaction budget,
// step-to-nearest-point, smoothing, extents, pushed vectors.

import { num } from "./contract.js";

// The compaction budget: a chart holds about this many points of a series (the server downsamples
// to it), and a series grown live past twice that is folded back to it with the envelope.
export const MAX_POINTS = 4000;

// The series folded back to the budget when live points grew it past twice that, else itself.
export const foldIfLong = (s) => (s.steps.length > 2 * MAX_POINTS ? compact(s, MAX_POINTS) : s);

// Index of the first point at or after a step (the last point when the step is past the end); -1 when empty.
export function nearestIndex(steps, step) {
  if (!steps?.length) return -1;
  const i = steps.findIndex((s) => s >= step);
  return i < 0 ? steps.length - 1 : i;
}

// A pushed vector in either wire form: a JSON list, or {f64: base64 float64 (little-endian), missing: [slots]}.
export function vec(v) {
  if (Array.isArray(v)) return v.map(num);
  const bytes = Uint8Array.from(atob(v.f64), (c) => c.charCodeAt(0));
  const out = Array.from(new Float64Array(bytes.buffer));
  for (const i of v.missing || []) out[i] = null;
  return out;
}

// Appends pushed points {steps, values, wall_times} to a held series, the same way on every page:
// points come in step order, so a step at or below the last one held is out of order (a resend, a
// script that logged an earlier step): it is not appended, and `late` tells the page to refetch.
// Returns {from: index of the first new point or undefined, late: count of out-of-order points}.
export function appendPoints(store, pts) {
  const from = store.steps.length;
  let late = 0;
  pts.steps.forEach((step, i) => {
    const last = store.steps.length ? store.steps[store.steps.length - 1] : -Infinity;
    if (step > last) {
      store.steps.push(step);
      store.values.push(num(pts.values[i]));
      store.walls.push(pts.wall_times[i]);
    } else late++;
  });
  return { from: store.steps.length > from ? from : undefined, late };
}

// The server's min/max envelope, for series that grow live past what a chart should hold:
// keeps each bucket's first, last, min and max points and its first NaN/+inf/-inf, so a
// spike that arrived live survives compaction exactly as it would a server-side downsample.
// This is the one browser-side copy of server/storage/downsample.py's envelope(): it runs on
// points the page already holds (no refetch, no window where live points could be lost), and
// tests/test_contract.py runs both on the same inputs and requires the same kept points.
export function compact(s, maxPoints) {
  const n = s.steps.length;
  if (n <= maxPoints) return s;
  const buckets = Math.max(1, Math.floor(maxPoints / 4)),
    lo = s.steps[0],
    width = (s.steps[n - 1] - lo + 1) / buckets;
  const keep = new Set();
  let start = 0;
  while (start < n) {
    const b = Math.floor((s.steps[start] - lo) / width);
    let end = start,
      minI = -1,
      maxI = -1;
    const special = {};
    while (end + 1 < n && Math.floor((s.steps[end + 1] - lo) / width) === b) end++;
    for (let i = start; i <= end; i++) {
      const v = s.values[i];
      if (v === null || v === undefined) continue;
      if (!isFinite(v)) {
        const k = isNaN(v) ? "nan" : v > 0 ? "+" : "-";
        if (!(k in special)) special[k] = i;
        continue;
      }
      if (minI < 0 || v < s.values[minI]) minI = i;
      if (maxI < 0 || v > s.values[maxI]) maxI = i;
    }
    for (const i of [start, end, minI, maxI, ...Object.values(special)]) if (i >= 0) keep.add(i);
    start = end + 1;
  }
  const idx = [...keep].sort((a, b) => a - b);
  return Object.assign({}, s, {
    steps: idx.map((i) => s.steps[i]),
    values: idx.map((i) => s.values[i]),
    walls: idx.map((i) => s.walls[i]),
  });
}

// TensorBoard-style EMA with debiasing, skipping non-finite values.
export function ema(values, weight) {
  const out = [];
  let last = 0,
    n = 0;
  for (const v of values) {
    if (!isFinite(v)) {
      out.push(null);
      continue;
    }
    last = last * weight + (1 - weight) * v;
    n++;
    out.push(last / (1 - weight ** n));
  }
  return out;
}

// Finite min/max over several series' values (null when there is none).
export function extent(seriesList) {
  let lo = Infinity,
    hi = -Infinity;
  for (const s of seriesList)
    for (const v of s.values)
      if (v !== null && isFinite(v)) {
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
  return lo === Infinity ? null : [lo, hi];
}

// The series divided by the size of its first finite, non-zero value (so it starts at ±1): runs on
// different scales read as relative change on one chart. A series with no such value is returned as is.
export function normalised(s) {
  const first = s.values.find((v) => v !== null && Number.isFinite(v) && v !== 0);
  if (first === undefined) return s;
  const by = Math.abs(first);
  return { ...s, values: s.values.map((v) => (v === null ? null : v / by)) };
}
