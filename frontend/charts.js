// Live line charts: traces per key, NaN/inf drawn as markers, alert lines, appends via extendTraces.
"use strict";

// A line chart bound to a set of keys of one or more series stores. Traces are SVG "scatter",
// not WebGL: every series is capped at ~8000 points (server envelope, live compaction), SVG is
// fast enough there, and browsers allow only a few WebGL contexts per page (compare can have many charts).
class LiveChart {
  constructor(div, opts) {
    this.div = div; this.opts = opts; this.traceOf = {}; this.pending = {}; this.drawn = false;
    this.shapes = []; this.visible = true; this.stale = false;
    // A live redraw costs tens of ms per chart: charts scrolled out of view skip them and redraw
    // once when they come back (opts.redraw supplies the current data).
    if (opts.redraw) {
      GW.onVisible(div, (visible) => {
        this.visible = visible;
        if (visible && this.stale) { this.stale = false; opts.redraw(); }
      });
    }
  }

  xOf(s, i, mode) {
    if (mode === "wall") return new Date(s.walls[i] * 1000);
    if (mode === "relative") return s.walls[i] - this.opts.t0();
    return s.steps[i];
  }

  // Full draw from the stores (first draw, axis/smoothing changes, new keys).
  render(entries, mode) {
    if (!entries.length && this.opts.empty) return this.showEmpty();
    if (this.empty) { this.div.replaceChildren(); this.empty = false; }
    const traces = []; this.traceOf = {};
    const nan = { x: [], y: [], text: [], type: "scatter", mode: "markers", yaxis: "y2", name: "NaN / inf",
      marker: { symbol: "x", size: 11, color: "#d92d20", line: { width: 2 } }, hoverinfo: "text", showlegend: false };
    for (const { label, series: s, color } of entries) {
      const x = s.steps.map((_, i) => this.xOf(s, i, mode));
      const y = s.values.map((v) => (isFinite(v) ? v : null));
      const idx = { raw: traces.length };
      const smooth = this.opts.smoothing && this.opts.smoothing() > 0;
      traces.push({ x, y, type: "scatter", mode: "lines", name: label, connectgaps: false,
        line: { width: smooth ? 1 : 1.6, color }, opacity: smooth ? 0.35 : 1, showlegend: !smooth });
      if (smooth) {
        idx.smooth = traces.length;
        traces.push({ x, y: GW.ema(s.values, this.opts.smoothing()), type: "scatter", mode: "lines",
          name: label, line: { width: 2, color } });
      }
      this.traceOf[label] = idx;
      s.values.forEach((v, i) => { if (!isFinite(v)) this.addNan(nan, label, s.steps[i], v, this.xOf(s, i, mode)); });
    }
    this.nanIndex = traces.length; traces.push(nan);
    const layout = GW.plotLayout({
      yaxis: Object.assign(GW.plotLayout().yaxis, { type: this.opts.log && this.opts.log() ? "log" : "linear",
        tickformat: this.opts.bytes ? "~s" : undefined, ticksuffix: this.opts.bytes ? "B" : undefined }),
      yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true },
      xaxis: Object.assign(GW.plotLayout().xaxis, { title: { text: mode === "step" ? "" : mode === "wall" ? "" : "seconds" } }),
      shapes: this.shapes,
    });
    Plotly.react(this.div, traces, layout, { responsive: true, displaylogo: false });
    this.drawn = true; this.mode = mode; this.labels = entries.map((e) => e.label).join("|");
  }

  // No data for this chart (yet): say why and what records it, instead of drawing empty axes.
  showEmpty() {
    if (this.drawn) Plotly.purge(this.div);
    this.div.replaceChildren(GW.el("p", { class: "empty muted" }, this.opts.empty));
    this.drawn = false; this.empty = true;
  }

  addNan(nan, label, step, v, x) {
    nan.x.push(x); nan.y.push(v === -Infinity ? 0.03 : 0.97);
    nan.text.push(label + " = " + GW.fmtNum(v) + " at step " + step);
  }

  // Append new points (already pushed into the stores) without redrawing everything.
  extend(entries, fresh, mode) {
    if (!this.visible && this.drawn) { this.stale = true; return; }
    if (!this.drawn || mode !== this.mode || entries.map((e) => e.label).join("|") !== this.labels) return this.render(entries, mode);
    const update = { x: [], y: [] }, indices = [];
    const nan = { x: [], y: [], text: [] };
    for (const { label, series: s } of entries) {
      const from = fresh[label]; if (from === undefined || from >= s.steps.length) continue;
      const x = [], y = [];
      for (let i = from; i < s.steps.length; i++) {
        x.push(this.xOf(s, i, mode)); y.push(isFinite(s.values[i]) ? s.values[i] : null);
        if (!isFinite(s.values[i])) this.addNan(nan, label, s.steps[i], s.values[i], this.xOf(s, i, mode));
      }
      const idx = this.traceOf[label];
      update.x.push(x); update.y.push(y); indices.push(idx.raw);
      if (idx.smooth !== undefined) {
        const all = GW.ema(s.values, this.opts.smoothing());
        update.x.push(x); update.y.push(all.slice(from)); indices.push(idx.smooth);
      }
    }
    if (nan.x.length) { update.x.push(nan.x); update.y.push(nan.y); indices.push(this.nanIndex); }
    if (indices.length) Plotly.extendTraces(this.div, update, indices);
    if (nan.text.length) {
      const t = this.div.data[this.nanIndex];
      Plotly.restyle(this.div, { text: [(t.text || []).slice(0, t.x.length - nan.x.length).concat(nan.text)] }, [this.nanIndex]);
    }
  }

  setAlertLines(xs) {
    this.shapes = xs.map((x) => ({ type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
      line: { color: "#d92d20", width: 1, dash: "dot" } }));
    if (this.drawn && !this.empty) Plotly.relayout(this.div, { shapes: this.shapes });
  }
}
