// A first-paint line chart in plain SVG: the run page draws its first charts with their data at once,
// before Plotly (3.5 MB, 1-2 s to start) has run; the Plotly chart replaces it (LiveChart.render).
// Same look as the Plotly charts (margins, colours, log axis choice, smoothing, 1e-4 numbers), no
// interaction: hover, zoom and the alert marks come with Plotly a moment later.

import { smooth, yAxis } from "./charts.js";
import { fmtNumber } from "./format.js";
import { dark, plotLayout } from "./plot.js";

const SVG = "http://www.w3.org/2000/svg";
const TICKS = 5;
const svgEl = (tag, attrs) => {
  const n = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
  return n;
};

// About `n` round numbers across [lo, hi] (1, 2 or 5 times a power of ten apart).
function niceTicks(lo, hi, n = TICKS) {
  const raw = (hi - lo) / n || Math.abs(lo) || 1,
    mag = 10 ** Math.floor(Math.log10(raw));
  const step = mag * ([1, 2, 5, 10].find((m) => m * mag >= raw) || 10);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

// Draws entries [{label, series: {steps, values}, color}] into div on a step axis; opts.log is the
// chart's log-y choice (null: automatic, as LiveChart decides), opts.smoothing its EMA weight.
// Returns the y axis chosen (yAxis()), or null when there was nothing finite to draw.
export function quickChart(div, entries, opts = {}) {
  div.querySelector(":scope > .quick-chart")?.remove();
  const w = div.clientWidth || 600,
    h = div.clientHeight || 300;
  const m = plotLayout().margin,
    legend = 22;
  const y = yAxis(
      entries.map((e) => e.series),
      opts.log,
    ),
    log = y.log;
  const ok = (v) => v !== null && Number.isFinite(v) && (!log || v > 0);
  let x0 = Infinity,
    x1 = -Infinity,
    y0 = Infinity,
    y1 = -Infinity;
  for (const { series: s } of entries)
    s.values.forEach((v, i) => {
      x0 = Math.min(x0, s.steps[i]);
      x1 = Math.max(x1, s.steps[i]);
      if (!ok(v)) return;
      const y = log ? Math.log10(v) : v;
      y0 = Math.min(y0, y);
      y1 = Math.max(y1, y);
    });
  if (y0 === Infinity) return null;
  if (y1 - y0 < 1e-12 * Math.max(1, Math.abs(y0)))
    [y0, y1] = [y0 - (Math.abs(y0) || 1) * 0.5, y1 + (Math.abs(y1) || 1) * 0.5];
  const pad = (y1 - y0) * 0.05;
  [y0, y1] = [y0 - pad, y1 + pad];
  if (x1 <= x0) x1 = x0 + 1;
  const pw = w - m.l - m.r,
    ph = h - m.t - m.b - legend;
  const px = (x) => m.l + ((x - x0) / (x1 - x0)) * pw;
  const py = (y) => m.t + ph - ((y - y0) / (y1 - y0)) * ph;
  const fg = dark() ? "#e6e9ef" : "#1d2330",
    grid = dark() ? "#2a2f3a" : "#e4e7ec";
  const svg = svgEl("svg", { class: "quick-chart", width: w, height: h, "font-size": 11, fill: fg });
  const yTicks = log ? niceTicks(Math.ceil(y0), Math.floor(y1), TICKS).filter(Number.isInteger) : niceTicks(y0, y1);
  for (const t of yTicks) {
    svg.append(svgEl("line", { x1: m.l, x2: m.l + pw, y1: py(t), y2: py(t), stroke: grid }));
    const label = svgEl("text", { x: m.l - 6, y: py(t) + 4, "text-anchor": "end" });
    if (log && Math.abs(t) > 1) {
      // 10 to the power, as Plotly's log axes write it
      const power = svgEl("tspan", { dy: -5, "font-size": 8 });
      power.textContent = String(t).replace("-", "\u2212");
      label.append("10", power);
    } else label.textContent = fmtNumber(log ? 10 ** t : t);
    svg.append(label);
  }
  for (const t of niceTicks(x0, x1)) {
    svg.append(svgEl("line", { x1: px(t), x2: px(t), y1: m.t, y2: m.t + ph, stroke: grid }));
    const label = svgEl("text", { x: px(t), y: m.t + ph + 16, "text-anchor": "middle" });
    label.textContent = fmtNumber(t);
    svg.append(label);
  }
  let lx = m.l;
  for (const e of entries) {
    const s = e.series,
      ys = opts.smoothing ? smooth(s.values, opts.smoothing) : s.values;
    let d = "",
      pen = "M";
    ys.forEach((v, i) => {
      if (!ok(v)) {
        pen = "M";
        return;
      }
      d += `${pen}${px(s.steps[i]).toFixed(1)} ${py(log ? Math.log10(v) : v).toFixed(1)}`;
      pen = "L";
    });
    svg.append(svgEl("path", { class: "line", d, fill: "none", stroke: e.color, "stroke-width": 1.8 }));
    const key = svgEl("text", { x: lx + 18, y: h - 6 });
    key.textContent = e.label;
    svg.append(svgEl("line", { x1: lx, x2: lx + 14, y1: h - 10, y2: h - 10, stroke: e.color, "stroke-width": 2 }), key);
    lx += 30 + 7 * String(e.label).length;
  }
  div.append(svg);
  return y;
}
