// Per-layer gradient norm heatmap (layer x step, log10 colour) that appends live pushes locally.
import { num } from "./contract.js";
import { el, onVisible } from "./dom.js";
import { getJSON } from "./fetch.js";
import { esc, fmtNumber } from "./format.js";
import { LoadBuffer } from "./live.js";
import { plotLayout, xRange } from "./plot.js";
import { vec } from "./series.js";

// NaN beats +inf beats -inf beats any finite value: a bad value in a bucket must stay visible.
const heatRank = (v) => (v === null ? 0 : Number.isNaN(v) ? 4 : v === Infinity ? 3 : v === -Infinity ? 2 : 1);
const heatMax = (a, b) => {
  const ra = heatRank(a),
    rb = heatRank(b);
  return ra !== rb ? (ra > rb ? a : b) : ra === 1 ? Math.max(a, b) : a;
};

// opts: what the values are ("norm", "ratio", "RMS") and the text shown while there are none (signals.js).
const GRAD_TEXT = {
  what: "norm",
  name: "per-layer gradient norms",
  empty: "No per-layer gradient norms yet. run.watch(model) records them after every backward pass or optimizer step.",
};

export class LiveHeatmap {
  constructor(div, runId, key, maxCols = 400, opts = {}) {
    Object.assign(this, {
      div,
      runId,
      key,
      maxCols,
      text: Object.assign({}, GRAD_TEXT, opts),
      layers: [],
      steps: [],
      cols: [],
      bucket: 1,
      zoomed: null,
      timer: null,
      visible: true,
      stale: false,
      buffer: new LoadBuffer(), // live pushes that arrive while load() fetches
    });
    // Like the line charts: no live redraws while scrolled out of view, one when it comes back.
    onVisible(div, (visible) => {
      this.visible = visible;
      if (visible && this.stale && !this.zoomed) {
        this.stale = false;
        this.draw();
      }
    });
  }

  // Full fetch: the whole run, or the zoomed step range at full detail.
  async load(range) {
    const q = range ? `&start=${Math.floor(range[0])}&end=${Math.ceil(range[1])}` : "";
    let h;
    this.buffer.start();
    try {
      h = await getJSON(
        `/api/runs/${this.runId}/heatmap?key=${encodeURIComponent(this.key)}&max_steps=${this.maxCols}${q}`,
      );
    } catch (e) {
      // 404: no per-layer norms (yet), say what records them. Anything else is a failure: say so,
      // and the next live push tries again (it calls load() while nothing is loaded).
      this.buffer.end(() => {}); // dropped: the next load fetches them
      this.failed = e.status !== 404;
      if (!this.loaded)
        this.showEmpty(
          this.failed
            ? "Could not load the " + this.text.name + ": " + e.message + ". Retrying on the next update."
            : null,
        );
      return;
    }
    this.failed = false;
    if (!this.loaded) this.div.replaceChildren();
    Object.assign(this, {
      layers: h.layers.map(esc),
      steps: h.steps,
      bucket: h.bucket,
      loaded: true,
      cols: h.steps.map((_, i) => h.layers.map((_, j) => num(h.values[j][i]))),
    });
    this.draw(range);
    // Pushes that arrived during the fetch: re-merging a step already counted changes nothing (max).
    this.buffer.end((push) => this.append(push));
  }

  // Nothing to draw: why (a failure, or no norms recorded yet and what records them).
  showEmpty(failure) {
    const text = failure || this.text.empty;
    this.div.replaceChildren(el("p", { class: "empty muted" + (failure ? " failed" : "") }, text));
  }

  // Live push {steps, values: [[per layer]]}: merge into the last bucket or open a new one.
  append(push) {
    if (this.buffer.hold(push)) return;
    if (this.zoomed) return;
    const cols = push.values.map(vec);
    if (!this.loaded || (cols[0] && cols[0].length !== this.layers.length)) {
      this.load();
      return;
    }
    push.steps.forEach((step, i) => {
      const col = cols[i],
        last = this.steps.length - 1;
      if (last >= 0 && step < this.steps[last]) return; // already in the fetched matrix
      if (last >= 0 && step >= this.steps[last] && step < this.steps[last] + this.bucket) {
        this.cols[last] = this.cols[last].map((v, j) => heatMax(v, col[j]));
      } else {
        const s0 = this.steps.length ? this.steps[0] : step;
        this.steps.push(this.bucket > 1 ? s0 + Math.floor((step - s0) / this.bucket) * this.bucket : step);
        this.cols.push(col);
      }
    });
    if (this.cols.length > 2 * this.maxCols) this.coarsen();
    // At most one redraw per 500 ms, or 4x the last redraw's cost when that is more.
    if (!this.timer) {
      this.timer = setTimeout(
        () => {
          this.timer = null;
          if (this.zoomed) return;
          if (this.visible) this.draw();
          else this.stale = true;
        },
        Math.max(500, 4 * (this.drawMs || 0)),
      );
    }
  }

  // Twice the bucket width, half the columns (keeps memory and redraw cost flat on long runs).
  coarsen() {
    const s0 = this.steps[0],
      width = this.bucket * 2,
      steps = [],
      cols = [];
    this.steps.forEach((s, i) => {
      const start = s0 + Math.floor((s - s0) / width) * width;
      if (steps.length && steps[steps.length - 1] === start)
        cols[cols.length - 1] = cols[cols.length - 1].map((v, j) => heatMax(v, this.cols[i][j]));
      else {
        steps.push(start);
        cols.push(this.cols[i]);
      }
    });
    Object.assign(this, { steps, cols, bucket: width });
  }

  draw(range) {
    const started = performance.now();
    const z = this.layers.map(() => []),
      zero = this.layers.map(() => []),
      bad = { x: [], y: [], text: [] };
    const span = this.bucket > 1 ? " (+" + (this.bucket - 1) + " steps)" : "";
    this.cols.forEach((col, i) => {
      col.forEach((v, j) => {
        z[j].push(v === null || !isFinite(v) || v <= 0 ? null : Math.log10(v));
        zero[j].push(v === 0 ? 1 : null); // exactly zero (dead or disconnected) is grey, not blank like "no grad"
        if (v !== null && !isFinite(v)) {
          bad.x.push(this.steps[i]);
          bad.y.push(this.layers[j]);
          bad.text.push(this.layers[j] + " @ " + this.steps[i] + span + ": " + fmtNumber(v));
        }
      });
    });
    // Hover text comes from templates, not one string per cell: that kept redraws of big matrices slow.
    const traces = [
      {
        type: "heatmap",
        x: this.steps,
        y: this.layers,
        z,
        colorscale: "Viridis",
        colorbar: { title: { text: "log10" } },
        hovertemplate: "%{y} @ step %{x}" + span + "<br>" + this.text.what + " 10^%{z:.2f}<extra></extra>",
      },
      {
        type: "heatmap",
        x: this.steps,
        y: this.layers,
        z: zero,
        showscale: false,
        colorscale: [
          [0, "#98a2b3"],
          [1, "#98a2b3"],
        ],
        hovertemplate: "%{y} @ step %{x}" + span + "<br>exactly 0<extra></extra>",
      },
      {
        type: "scatter",
        mode: "markers",
        x: bad.x,
        y: bad.y,
        text: bad.text,
        hoverinfo: "text",
        marker: { symbol: "x", color: "#d92d20", size: 8 },
        name: "NaN / inf",
        showlegend: false,
      },
    ];
    const xaxis = range ? { range: [range[0], range[1]] } : { autorange: true };
    // Room for every layer's row: ~9 px each, between 300 px and 1400 px (big models scroll the page).
    this.div.style.height = Math.min(1400, Math.max(300, 60 + 9 * this.layers.length)) + "px";
    this.ignore = true;
    Plotly.react(
      this.div,
      traces,
      plotLayout({
        showlegend: false,
        margin: { l: 160, r: 16, t: 8, b: 36 },
        xaxis: Object.assign(plotLayout().xaxis, xaxis),
        yaxis: { autorange: "reversed", type: "category", automargin: true },
      }),
      { responsive: true, displaylogo: false },
    ).then(() => {
      this.ignore = false;
      this.listen();
      this.drawMs = performance.now() - started;
    });
  }

  // Drag-zoom on the heatmap fetches that step range at full detail; double-click goes back to live.
  listen() {
    if (this.listening || !this.div.on) return;
    this.listening = true;
    this.div.on("plotly_relayout", (ev) => {
      if (this.ignore) return;
      if (ev["xaxis.autorange"]) {
        this.zoomed = null;
        this.load();
        return;
      }
      const [lo, hi] = xRange(ev);
      if (lo === undefined || hi === undefined) return;
      this.zoomed = [lo, hi];
      this.load(this.zoomed);
    });
  }
}
