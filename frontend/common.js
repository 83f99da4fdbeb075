// Shared helpers for the gradwatch pages. User data is always rendered with textContent.
"use strict";

const GW = {};

// Non-finite numbers travel as strings; turn them back into numbers.
GW.num = (v) => (v === "NaN" ? NaN : v === "Infinity" ? Infinity : v === "-Infinity" ? -Infinity : v);

GW.getJSON = async (url, options) => {
  const r = await fetch(url, options);
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { const body = await r.json(); msg = body.error || body.detail || msg; } catch (e) { /* not JSON */ }
    throw new Error(typeof msg === "string" ? msg : JSON.stringify(msg));
  }
  return r.json();
};

GW.el = (tag, attrs = {}, ...children) => {
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
};

GW.fmtTime = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
GW.fmtNum = (v) => {
  if (v === null || v === undefined) return "";
  if (typeof v === "string") return v;
  if (!isFinite(v)) return isNaN(v) ? "NaN" : v > 0 ? "+inf" : "-inf";
  return Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : String(+v.toPrecision(5));
};
GW.fmtBytes = (b) => {
  if (b === null || b === undefined || !isFinite(b)) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + " " + u[i];
};

// A websocket that reconnects; onopen fires after every (re)connect so pages can resync.
GW.live = (path, onMessage, onOpen) => {
  let ws, closed = false, delay = 500;
  const connect = () => {
    ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
    ws.onmessage = (ev) => onMessage(JSON.parse(ev.data));
    ws.onopen = () => { delay = 500; if (onOpen) onOpen(); };
    ws.onclose = () => { if (!closed) setTimeout(connect, delay = Math.min(delay * 2, 8000)); };
  };
  connect();
  return { close: () => { closed = true; ws.close(); } };
};

// One colour per run id, the same on every chart and page.
GW.PALETTE = ["#2f6fed", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0c8599", "#a61e4d", "#5c940d", "#1864ab", "#d9480f"];
GW.colorFor = (id) => GW.PALETTE[Math.abs(Number(id)) % GW.PALETTE.length];

GW.dark = () => window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
GW.plotLayout = (extra = {}) => {
  const fg = GW.dark() ? "#e6e9ef" : "#1d2330", grid = GW.dark() ? "#2a2f3a" : "#e4e7ec";
  return Object.assign({
    margin: { l: 56, r: 16, t: 8, b: 36 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: fg, size: 11 }, showlegend: true, legend: { orientation: "h", y: -0.2 },
    xaxis: { gridcolor: grid, zeroline: false }, yaxis: { gridcolor: grid, zeroline: false },
    hovermode: "x unified",
  }, extra);
};

// The new x range of a plotly_relayout event (a drag sends range[0]/[1], code may send the array).
GW.xRange = (ev) => ev["xaxis.range"] || [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];

// A pushed vector in either wire form: a JSON list, or {f64: base64 float64 (little-endian), missing: [slots]}.
GW.vec = (v) => {
  if (Array.isArray(v)) return v.map(GW.num);
  const bytes = Uint8Array.from(atob(v.f64), (c) => c.charCodeAt(0));
  const out = Array.from(new Float64Array(bytes.buffer));
  for (const i of v.missing || []) out[i] = null;
  return out;
};

// Calls onChange(visible) when an element scrolls into or out of view (live redraws skip hidden charts).
GW.onVisible = (el, onChange) => {
  if ("IntersectionObserver" in window) new IntersectionObserver((seen) => onChange(seen[seen.length - 1].isIntersecting)).observe(el);
};

// The server's min/max envelope, for series that grow live past what a chart should hold:
// keeps each bucket's first, last, min and max points and its first NaN/+inf/-inf, so a
// spike that arrived live survives compaction exactly as it would a server-side downsample.
GW.compact = (s, maxPoints) => {
  const n = s.steps.length;
  if (n <= maxPoints) return s;
  const buckets = Math.max(1, Math.floor(maxPoints / 4)), lo = s.steps[0], width = (s.steps[n - 1] - lo + 1) / buckets;
  const keep = new Set();
  let start = 0;
  while (start < n) {
    const b = Math.floor((s.steps[start] - lo) / width);
    let end = start, minI = -1, maxI = -1;
    const special = {};
    while (end + 1 < n && Math.floor((s.steps[end + 1] - lo) / width) === b) end++;
    for (let i = start; i <= end; i++) {
      const v = s.values[i];
      if (v === null || v === undefined) continue;
      if (!isFinite(v)) { const k = isNaN(v) ? "nan" : v > 0 ? "+" : "-"; if (!(k in special)) special[k] = i; continue; }
      if (minI < 0 || v < s.values[minI]) minI = i;
      if (maxI < 0 || v > s.values[maxI]) maxI = i;
    }
    for (const i of [start, end, minI, maxI, ...Object.values(special)]) if (i >= 0) keep.add(i);
    start = end + 1;
  }
  const idx = [...keep].sort((a, b) => a - b);
  return Object.assign({}, s, { steps: idx.map((i) => s.steps[i]), values: idx.map((i) => s.values[i]), walls: idx.map((i) => s.walls[i]) });
};

// TensorBoard-style EMA with debiasing, skipping non-finite values.
GW.ema = (values, weight) => {
  const out = []; let last = 0, n = 0;
  for (const v of values) {
    if (!isFinite(v)) { out.push(null); continue; }
    last = last * weight + (1 - weight) * v; n++;
    out.push(last / (1 - Math.pow(weight, n)));
  }
  return out;
};
