// The LR range test view (gradwatch.lr_find runs): loss against learning rate on a log x axis, the
// suggested LR marked, and the reason written beside the chart. Pairs each loss point with the
// LR logged at the same step; redrawn as the sweep streams in.
import { el } from "../../lib/dom.js";
import { esc, fmtNumber } from "../../lib/format.js";
import { plotLayout } from "../../lib/plot.js";

export const isLrFind = (keys) => keys.includes("lr_find/smoothed_loss");

function against(lrAt, s) {
  const x = [],
    y = [];
  if (!s) return { x, y };
  s.steps.forEach((step, i) => {
    if (lrAt.has(step) && isFinite(s.values[i])) {
      x.push(lrAt.get(step));
      y.push(s.values[i]);
    }
  });
  return { x, y };
}

function card(box) {
  let root = box.querySelector(".lr-find");
  if (root) return root;
  root = el(
    "div",
    { class: "card wide lr-find", style: "margin-bottom:14px" },
    el("h3", {}, "LR range test: loss against learning rate"),
    el(
      "div",
      { class: "lr-find-body", style: "display:flex;gap:16px;align-items:flex-start;flex-wrap:wrap" },
      el("div", { id: "lr-find-chart", class: "chart", style: "flex:1 1 480px;min-width:0" }),
      el(
        "div",
        { class: "lr-find-side", style: "flex:0 1 340px" },
        el("p", { id: "lr-find-lr", class: "lr-find-lr" }),
        el("p", { id: "lr-find-reason" }),
      ),
    ),
  );
  box.replaceChildren(root);
  return root;
}

// S: the run page's state (keys, series by key, alerts). Does nothing for other runs.
export function renderLrFind(box, S) {
  if (!isLrFind(S.keys) || !S.series.lr) return;
  card(box);
  const lrAt = new Map(S.series.lr.steps.map((step, i) => [step, S.series.lr.values[i]]));
  const raw = against(lrAt, S.series.loss),
    smooth = against(lrAt, S.series["lr_find/smoothed_loss"]);
  const alert = [...S.alerts].reverse().find((a) => a.kind === "lr_suggestion");
  const lr = alert && typeof alert.value === "number" ? alert.value : null;
  const traces = [
    { x: raw.x, y: raw.y, type: "scatter", mode: "lines", name: "loss", line: { width: 1, color: "#9aa3b2" } },
    {
      x: smooth.x,
      y: smooth.y,
      type: "scatter",
      mode: "lines",
      name: "smoothed loss",
      line: { width: 2.2, color: "#3b5bdb" },
    },
  ];
  if (lr !== null && smooth.y.length) {
    // A trace, not a shape: shape coordinates on a log axis are easy to get wrong.
    const lo = Math.min(...smooth.y, ...raw.y),
      hi = Math.max(...smooth.y, ...raw.y);
    traces.push({
      x: [lr, lr],
      y: [lo, hi],
      type: "scatter",
      mode: "lines",
      name: "suggested " + esc(fmtNumber(lr)),
      line: { color: "#d92d20", width: 2, dash: "dash" },
      hoverinfo: "name",
    });
  }
  const layout = plotLayout({ hovermode: "closest" });
  layout.xaxis = Object.assign(layout.xaxis, {
    type: "log",
    title: { text: "learning rate" },
    exponentformat: "power",
  });
  layout.yaxis = Object.assign(layout.yaxis, { title: { text: "loss" } });
  Plotly.react(document.getElementById("lr-find-chart"), traces, layout, { responsive: true, displaylogo: false });
  document.getElementById("lr-find-lr").textContent = lr !== null ? "Suggested learning rate: " + fmtNumber(lr) : "";
  document.getElementById("lr-find-reason").textContent = alert
    ? alert.message
    : "Sweeping the learning rate; the suggestion appears when the sweep ends.";
}
