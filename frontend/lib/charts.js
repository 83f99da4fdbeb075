// Live line charts: traces per key, NaN/inf drawn as markers, alert lines, appends via extendTraces.
import { onVisible } from "./dom.js";
import { esc, fmtNumber } from "./format.js";
import { plotLayout } from "./plot.js";
import { extent } from "./series.js";

const CATCH_UP_MS = 5000; // an out-of-view chart is never more than this behind (screenshots, printing)

// The y axis for some series: log when asked, or (asked nothing) when the values span more than
// 3 decades, so a diverging loss does not flatten everything else; a readable log axis (a label
// per decade or 1-2-5, never the crammed "2 3 ... 9" minor labels); and a flat series (a constant
// learning rate) centred on its value, not drawn on a made-up 0 line. With `every` (several runs on
// one chart) the automatic log is taken only when each series on its own spans the 3 decades: a log
// axis for one diverging run would squeeze the healthy ones into one line.
const decadesOf = (ext) => (ext && ext[0] > 0 ? Math.log10(ext[1] / ext[0]) : 0);
export function yAxis(seriesList, logChoice, bytes, every = false) {
  const ext = extent(seriesList);
  const decades = decadesOf(ext);
  const auto = logChoice === null || logChoice === undefined;
  const helps = every ? seriesList.every((s) => decadesOf(extent([s])) > 3) : decades > 3;
  const log = auto ? helps : Boolean(logChoice);
  const axis = {
    type: log ? "log" : "linear",
    autorange: true,
    tickformat: bytes ? "~s" : undefined,
    ticksuffix: bytes ? "B" : undefined,
  };
  if (log) {
    Object.assign(axis, {
      // Under about half a decade, 1-2-5 labels can leave a single tick: label every digit there.
      dtick: decades > 1.5 ? Math.max(1, Math.ceil(decades / 6)) : decades > 0.6 ? "D2" : "D1",
      exponentformat: "power",
      minor: { ticks: "" },
    });
  } else if (auto && every && !helps && decades > 3) {
    // Some runs span the decades (one diverged), others do not: linear, fitted to the runs in range,
    // so the healthy ones stay apart and the diverging one leaves the chart where it diverged.
    const calm = extent(seriesList.filter((s) => decadesOf(extent([s])) <= 3));
    if (calm) {
      const pad = (calm[1] - calm[0]) * 0.15 || Math.abs(calm[1]) * 0.5 || 1;
      Object.assign(axis, { autorange: false, range: [calm[0] - pad, calm[1] + pad] });
      return { axis, log, auto: false, decades, clipped: true };
    }
  } else if (ext && ext[1] - ext[0] <= 1e-9 * Math.max(Math.abs(ext[0]), Math.abs(ext[1]))) {
    const v = ext[0],
      pad = v === 0 ? 1 : Math.abs(v) * 0.5;
    Object.assign(axis, { autorange: false, range: [v - pad, v + pad] });
  }
  return { axis, log, auto: auto && log, decades };
}

// TensorBoard's debiased EMA, restarted after a non-finite value (a NaN is no number to average),
// and kept within the range of the raw values of its effective window (1 / (1 - weight) points):
// once a spike has ended the smoothed line comes back with the raw one, instead of showing for
// many steps values the loss never had there (MNIST at lr 1000: ~1e4 smoothed over a raw ~3).
export function smooth(values, weight) {
  const out = new Array(values.length).fill(null);
  const span = Math.max(1, Math.ceil(1 / (1 - weight)));
  const lo = [],
    hi = []; // indices of the window's running min and max (monotonic queues)
  let last = 0,
    n = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v === null || !Number.isFinite(v)) {
      last = n = lo.length = hi.length = 0;
      continue;
    }
    last = last * weight + (1 - weight) * v;
    n++;
    while (lo.length && values[lo[lo.length - 1]] >= v) lo.pop();
    while (hi.length && values[hi[hi.length - 1]] <= v) hi.pop();
    lo.push(i);
    hi.push(i);
    while (lo[0] <= i - span) lo.shift();
    while (hi[0] <= i - span) hi.shift();
    out[i] = Math.min(Math.max(last / (1 - weight ** n), values[lo[0]]), values[hi[0]]);
  }
  return out;
}

const finiteCount = (s) => s.values.reduce((n, v) => n + (v !== null && Number.isFinite(v) ? 1 : 0), 0);

// The one value of series that never change (at least 2 points, all equal), else null.
function constantOf(entries) {
  if (entries.length !== 1) return null;
  const vs = entries[0].series.values;
  if (vs.length < 2 || !vs.every((v) => v === vs[0] && Number.isFinite(v))) return null;
  return vs[0];
}

// A line chart bound to entries {label, series, color?, t0?}. Traces are SVG "scatter", not WebGL:
// every series is capped at ~8000 points (server envelope, live compaction), SVG is fast enough
// there, and browsers allow only a few WebGL contexts per page (compare can have many charts).
export class LiveChart {
  constructor(div, opts) {
    this.div = div;
    this.opts = opts;
    this.traceOf = {};
    this.drawn = false;
    this.shapes = [];
    this.annotations = [];
    this.visible = true;
    this.stale = false;
    this.catchUp = null;
    this.draws = 0;
    // A live redraw costs tens of ms per chart: charts scrolled out of view skip them, catch up
    // every few seconds, and redraw at once when they come back (opts.redraw supplies the data).
    if (opts.redraw) {
      onVisible(div, (visible) => {
        this.visible = visible;
        if (visible && this.stale) this.refresh();
      });
    }
  }

  refresh() {
    this.stale = false;
    clearTimeout(this.catchUp);
    this.catchUp = null;
    this.opts.redraw();
  }
  count() {
    this.div.dataset.draws = ++this.draws;
  }

  xOf(s, i, mode, t0) {
    if (mode === "wall") return new Date(s.walls[i] * 1000);
    if (mode === "relative") return s.walls[i] - t0;
    return s.steps[i];
  }
  t0Of(entry) {
    return entry.t0 !== undefined ? entry.t0 : this.opts.t0 ? this.opts.t0() : 0;
  }

  // Full draw (first draw, axis/smoothing changes, new keys, compaction, catch-up).
  render(entries, mode) {
    if (!entries.length && this.opts.empty) return this.showEmpty();
    const constant = this.opts.scalars ? constantOf(entries) : null;
    if (constant !== null) return this.showValue(entries[0], constant);
    if (this.empty) {
      this.div.replaceChildren();
      this.empty = false;
      this.div.classList.remove("scalar");
    }
    this.div.querySelector(":scope > .quick-chart")?.remove(); // the first-paint sketch (quickchart.js)
    // One point makes no line: such series are drawn as markers until they have two.
    this.sparse = entries.some((e) => finiteCount(e.series) < 2);
    const traces = [];
    this.traceOf = {};
    const nan = {
      x: [],
      y: [],
      text: [],
      type: "scatter",
      mode: "markers",
      yaxis: "y2",
      name: "NaN / inf",
      marker: { symbol: "x", size: 11, color: "#d92d20", line: { width: 2 } },
      hoverinfo: "text",
      showlegend: false,
    };
    const smoothing = this.opts.smoothing ? this.opts.smoothing() : 0;
    for (const entry of entries) {
      const { label, series: s, color } = entry,
        t0 = this.t0Of(entry);
      const x = s.steps.map((_, i) => this.xOf(s, i, mode, t0));
      const y = s.values.map((v) => (isFinite(v) ? v : null));
      const idx = { raw: traces.length };
      traces.push({
        x,
        y,
        type: "scatter",
        mode: finiteCount(s) < 2 ? "markers" : "lines",
        name: esc(label),
        connectgaps: false,
        line: { width: smoothing ? 1.2 : 1.6, color },
        marker: { size: 8, color },
        opacity: smoothing ? 0.5 : 1, // the raw line stays readable under the smoothed one
        showlegend: !smoothing,
      });
      if (smoothing) {
        idx.smooth = traces.length;
        traces.push({
          x,
          y: smooth(s.values, smoothing),
          type: "scatter",
          mode: "lines",
          name: esc(label),
          line: { width: 2, color },
        });
      }
      this.traceOf[label] = idx;
      s.values.forEach((v, i) => {
        if (!isFinite(v)) this.addNan(nan, label, s.steps[i], v, this.xOf(s, i, mode, t0));
      });
    }
    this.nanIndex = traces.length;
    traces.push(nan);
    this.y = yAxis(
      entries.map((e) => e.series),
      this.opts.log ? this.opts.log() : false,
      this.opts.bytes,
      this.opts.logEvery,
    );
    const base = plotLayout();
    const layout = plotLayout({
      yaxis: Object.assign(base.yaxis, this.y.axis),
      yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true },
      xaxis: Object.assign(base.xaxis, {
        title: { text: this.opts.xTitle ? esc(this.opts.xTitle(mode)) : mode === "relative" ? "seconds" : "" },
      }),
      shapes: this.shapes,
      annotations: this.annotations,
      margin: Object.assign({}, base.margin, { t: this.annotations.length ? 22 : base.margin.t }),
    });
    Plotly.react(this.div, traces, layout, { responsive: true, displaylogo: false });
    this.drawn = true;
    this.mode = mode;
    this.labels = entries.map((e) => e.label).join("|");
    this.count();
    if (this.opts.onAxis) this.opts.onAxis(this.y);
  }

  // A series that never changed: its value, not a flat line (HF's train_runtime, a constant flag).
  showValue(entry, value) {
    if (this.drawn) Plotly.purge(this.div);
    const s = entry.series,
      n = s.steps.length;
    this.div.replaceChildren(
      textEl("p", "scalar-value", fmtNumber(value)),
      textEl("p", "muted", `${n} points, steps ${s.steps[0]}-${s.steps[n - 1]}, all the same`),
    );
    this.div.classList.add("scalar");
    this.drawn = false;
    this.empty = true;
    this.count();
  }

  // No data for this chart (yet): say why and what records it, instead of drawing empty axes.
  showEmpty() {
    if (this.drawn) Plotly.purge(this.div);
    this.div.replaceChildren(
      Object.assign(document.createElement("p"), { className: "empty muted", textContent: this.opts.empty }),
    );
    this.drawn = false;
    this.empty = true;
  }

  addNan(nan, label, step, v, x) {
    nan.x.push(x);
    nan.y.push(v === -Infinity ? 0.03 : 0.97);
    nan.text.push(esc(label) + " = " + fmtNumber(v) + " at step " + step);
  }

  // Append new points (already in the entries' series) from index fresh[label] on, without a full redraw.
  extend(entries, fresh, mode) {
    if (!this.visible && this.drawn) {
      this.stale = true;
      if (!this.catchUp)
        this.catchUp = setTimeout(() => {
          this.catchUp = null;
          if (this.stale) this.refresh();
        }, CATCH_UP_MS);
      return;
    }
    if (!this.drawn || this.sparse || mode !== this.mode || entries.map((e) => e.label).join("|") !== this.labels)
      return this.render(entries, mode);
    // A new value can change the axis (a constant LR starts to decay, a loss starts to diverge).
    const y = yAxis(
      entries.map((e) => e.series),
      this.opts.log ? this.opts.log() : false,
      this.opts.bytes,
      this.opts.logEvery,
    );
    if (
      y.log !== this.y.log ||
      (this.y.axis.range && JSON.stringify(y.axis.range) !== JSON.stringify(this.y.axis.range)) ||
      (y.log && y.axis.dtick !== this.y.axis.dtick)
    )
      return this.render(entries, mode);
    const update = { x: [], y: [] },
      indices = [];
    const nan = { x: [], y: [], text: [] };
    for (const entry of entries) {
      const { label, series: s } = entry,
        t0 = this.t0Of(entry);
      const from = fresh[label];
      if (from === undefined || from >= s.steps.length) continue;
      const x = [],
        yv = [];
      for (let i = from; i < s.steps.length; i++) {
        x.push(this.xOf(s, i, mode, t0));
        yv.push(isFinite(s.values[i]) ? s.values[i] : null);
        if (!isFinite(s.values[i])) this.addNan(nan, label, s.steps[i], s.values[i], this.xOf(s, i, mode, t0));
      }
      const idx = this.traceOf[label];
      update.x.push(x);
      update.y.push(yv);
      indices.push(idx.raw);
      if (idx.smooth !== undefined) {
        update.x.push(x);
        update.y.push(smooth(s.values, this.opts.smoothing()).slice(from));
        indices.push(idx.smooth);
      }
    }
    if (nan.x.length) {
      update.x.push(nan.x);
      update.y.push(nan.y);
      indices.push(this.nanIndex);
    }
    if (indices.length) {
      Plotly.extendTraces(this.div, update, indices);
      this.count();
    }
    if (nan.text.length) {
      const t = this.div.data[this.nanIndex];
      Plotly.restyle(this.div, { text: [(t.text || []).slice(0, t.x.length - nan.x.length).concat(nan.text)] }, [
        this.nanIndex,
      ]);
    }
  }

  // Vertical dotted lines at alerts: xs is a list of x values or of {x, color, label, text}. A label
  // is a small mark at the top of its line, and hovering it shows the text (what the alert said).
  setAlertLines(xs, redraw = true) {
    const items = xs.map((a) => (a !== null && typeof a === "object" && "x" in a ? a : { x: a }));
    this.shapes = items.map((a) => ({
      type: "line",
      xref: "x",
      yref: "paper",
      x0: a.x,
      x1: a.x,
      y0: 0,
      y1: 1,
      line: { color: a.color || "#d92d20", width: 1, dash: "dot" },
    }));
    this.annotations = items
      .filter((a) => a.label)
      .map((a) => ({
        x: a.x,
        xref: "x",
        y: 1,
        yref: "paper",
        yanchor: "bottom",
        text: esc(a.label),
        hovertext: esc(a.text || a.label),
        showarrow: false,
        font: { size: 10, color: a.color || "#d92d20" },
        captureevents: true,
      }));
    if (redraw && this.drawn && !this.empty)
      Plotly.relayout(this.div, {
        shapes: this.shapes,
        annotations: this.annotations,
        "margin.t": this.annotations.length ? 22 : plotLayout().margin.t,
      });
  }
}

const textEl = (tag, className, text) => Object.assign(document.createElement(tag), { className, textContent: text });
