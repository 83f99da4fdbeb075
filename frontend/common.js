// Shared helpers for the gradwatch pages (an ES module). User data is always rendered with
// textContent, and passed to Plotly only through esc() (Plotly reads a subset of HTML in names).

// The facts the pages share with the server (run statuses, alert kinds, the metric-key vocabulary,
// option lists, the column grammar, the float codec) come from /contract.js, which the server
// generates from gradwatch.contract (client_hook/contract/). Pages import them from here.
// (gradwatch report inlines both modules and drops these two statements.)
import { decodeFloat } from "/contract.js";

export {
  AGGREGATIONS,
  ALERT_KINDS,
  BANDS,
  CUSTOM_RULE_OPS,
  CUSTOM_RULE_TYPES,
  ENDED_STATUSES,
  FAMILIES,
  isLayerKey,
  isLossKey,
  isLrKey,
  KEYS,
  parseColumn,
  SEVERITIES,
  STATUSES,
  splitColumns,
  TIME_AXES,
} from "/contract.js";

// Non-finite numbers travel as strings; turn them back into numbers.
export const num = decodeFloat;

// Plotly renders <b>, <br>, <a href> ... in trace names, hover text, tick labels and titles: escape
// anything a user named (runs, metric keys, layers) before it gets there.
export const esc = (s) =>
  String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

export async function getJSON(url, options) {
  const r = await fetch(url, options);
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try {
      const body = await r.json();
      msg = body.error || body.detail || msg;
    } catch {
      /* not JSON */
    }
    const err = new Error(typeof msg === "string" ? msg : JSON.stringify(msg));
    err.status = r.status; // 404 means "not there (yet)"; anything else is a failure to say so
    throw err;
  }
  return r.json();
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export const fmtTime = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
export function fmtNum(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "string") return v;
  if (!isFinite(v)) return isNaN(v) ? "NaN" : v > 0 ? "+inf" : "-inf";
  return Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : String(+v.toPrecision(5));
}
export function fmtBytes(b) {
  if (b === null || b === undefined || !isFinite(b)) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(b) >= 1024 && i < u.length - 1) {
    b /= 1024;
    i++;
  }
  return b.toFixed(i ? 1 : 0) + " " + u[i];
}
export function fmtDuration(s) {
  if (s === null || s === undefined || !isFinite(s) || s < 0) return "";
  if (s < 60) return Math.round(s) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
}

// A websocket that reconnects; onOpen fires after every (re)connect so pages can resync.
export function live(path, onMessage, onOpen) {
  let ws,
    closed = false,
    delay = 500;
  const connect = () => {
    ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
    ws.onmessage = (ev) => onMessage(JSON.parse(ev.data));
    ws.onopen = () => {
      delay = 500;
      if (onOpen) onOpen();
    };
    ws.onclose = () => {
      if (closed) return;
      delay = Math.min(delay * 2, 8000);
      setTimeout(connect, delay);
    };
  };
  connect();
  return {
    close: () => {
      closed = true;
      ws.close();
    },
  };
}

// One colour per run id, the same on every chart and page. Blues, violets, cyans and a grey:
// no green, red, orange or yellow, which would read as "healthy" or "in trouble".
export const PALETTE = ["#3b5bdb", "#ae3ec9", "#1098ad", "#7048e8", "#5f6b7a", "#1c7ed6", "#cc5de8", "#0b7285"];
export const colorFor = (id) => PALETTE[Math.abs(Number(id)) % PALETTE.length];

export const dark = () => window.matchMedia?.("(prefers-color-scheme: dark)").matches;
export function plotLayout(extra = {}) {
  const fg = dark() ? "#e6e9ef" : "#1d2330",
    grid = dark() ? "#2a2f3a" : "#e4e7ec";
  return Object.assign(
    {
      margin: { l: 56, r: 16, t: 8, b: 36 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: fg, size: 11 },
      showlegend: true,
      legend: { orientation: "h", y: -0.2 },
      xaxis: { gridcolor: grid, zeroline: false },
      yaxis: { gridcolor: grid, zeroline: false },
      hovermode: "x unified",
    },
    extra,
  );
}

// The new x range of a plotly_relayout event (a drag sends range[0]/[1], code may send the array).
export const xRange = (ev) => ev["xaxis.range"] || [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];

// A pushed vector in either wire form: a JSON list, or {f64: base64 float64 (little-endian), missing: [slots]}.
export function vec(v) {
  if (Array.isArray(v)) return v.map(num);
  const bytes = Uint8Array.from(atob(v.f64), (c) => c.charCodeAt(0));
  const out = Array.from(new Float64Array(bytes.buffer));
  for (const i of v.missing || []) out[i] = null;
  return out;
}

// Calls onChange(visible) when an element scrolls into or out of view (live redraws skip hidden charts).
export function onVisible(element, onChange) {
  if ("IntersectionObserver" in window)
    new IntersectionObserver((seen) => onChange(seen[seen.length - 1].isIntersecting)).observe(element);
}

// Runs fn at most once per minMs, or `factor` x its own last duration when that is more, so that
// redraws never take over the page on big runs or slow machines. Returns schedule(). A named one
// reports its durations to window.__gwFlushMs when a benchmark sets it.
export function throttle(fn, minMs = 150, factor = 3, name = "") {
  let timer = null,
    lastMs = 0;
  return () => {
    if (timer) return;
    timer = setTimeout(
      () =>
        requestAnimationFrame(() => {
          timer = null;
          const t = performance.now();
          fn();
          lastMs = performance.now() - t;
          if (window.__gwFlushMs && name) window.__gwFlushMs.push(lastMs); // benchmarks/bench_pages.py listens here
        }),
      Math.max(minMs, factor * lastMs),
    );
  };
}

// One key of one run, as the pages hold it: {steps, values (numbers), walls}.
export async function fetchSeries(runId, key, query = "max_points=4000") {
  const s = await getJSON(`/api/runs/${runId}/series?key=${encodeURIComponent(key)}&${query}`);
  return { steps: s.steps, values: s.values.map(num), walls: s.wall_times };
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
