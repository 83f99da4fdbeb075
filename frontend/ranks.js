// Runs of one torch.distributed job (init(all_ranks=True) streams each rank as a run of its own,
// grouped by meta.group): a rank selector, and one chart overlaying a metric across every rank so
// a straggler (fewer steps) or a rank that diverges stands out.
import { el, esc, fetchSeries, getJSON, PALETTE, plotLayout } from "./common.js";

const REFRESH_MS = 5000;

export async function renderRanks(box, run, keys) {
  if (!run?.meta?.group) return;
  let data;
  try {
    data = await getJSON(`/api/runs/${run.id}/ranks`);
  } catch {
    return;
  }
  const ranks = data.ranks;
  const rankSel = el(
    "select",
    {
      id: "rank-select",
      onchange: (ev) => {
        location.href = "/runs/" + ev.target.value;
      },
    },
    ...ranks.map((r) => el("option", { value: r.id }, `rank ${r.rank} · ${r.status}`)),
  );
  rankSel.value = String(run.id);
  const choices = keys.filter((k) => !k.startsWith("grad/") || k === "grad/global_norm");
  const keySel = el("select", { id: "rank-key" }, ...choices.map((k) => el("option", { value: k }, k)));
  keySel.value = choices.includes("loss") ? "loss" : choices[0] || "";
  const chart = el("div", { id: "rank-chart", class: "chart" });
  box.replaceChildren(
    el(
      "div",
      { class: "card wide ranks", style: "margin-bottom:14px" },
      el(
        "h3",
        {},
        `Ranks: ${ranks.length} of ${data.world_size} `,
        el("label", {}, "rank ", rankSel),
        " ",
        el("label", {}, "metric ", keySel),
        " ",
        el("a", { href: "/compare?ids=" + ranks.map((r) => r.id).join(",") }, "Compare ranks"),
      ),
      chart,
    ),
  );
  const draw = async () => {
    const key = keySel.value;
    const series = await Promise.all(ranks.map((r) => fetchSeries(r.id, key).catch(() => null)));
    const traces = ranks.map((r, i) => ({
      x: series[i] ? series[i].steps : [],
      y: series[i] ? series[i].values.map((v) => (isFinite(v) ? v : null)) : [],
      type: "scatter",
      mode: "lines",
      name: esc(`rank ${r.rank}`),
      line: { color: PALETTE[i % PALETTE.length], width: r.id === run.id ? 2.4 : 1.4 },
    }));
    Plotly.react(chart, traces, plotLayout(), { responsive: true, displaylogo: false });
    chart.dataset.ranks = String(traces.filter((t) => t.x.length).length);
  };
  keySel.addEventListener("change", draw);
  await draw();
  if (ranks.some((r) => r.status === "running")) setInterval(draw, REFRESH_MS);
}
