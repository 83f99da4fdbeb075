// Runs of one torch.distributed job (init(all_ranks=True) streams each rank as a run of its own,
// grouped by meta.group): a rank selector, and one chart overlaying a metric across every rank so
// a straggler (fewer steps) or a rank that diverges stands out. The server names the straggler (a rank
// whose recent median step time is >= 30 % above the ranks' median, storage/ranks.py); the selector says so.
import { KEYS } from "../../lib/contract.js";
import { el } from "../../lib/dom.js";
import { fetchSeries, getJSON } from "../../lib/fetch.js";
import { esc } from "../../lib/format.js";
import { PALETTE, plotLayout } from "../../lib/plot.js";

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
    ...ranks.map((r) => el("option", { value: r.id, class: r.straggler ? "straggler" : "" }, rankLabel(r))),
  );
  rankSel.value = String(run.id);
  const choices = keys.filter((k) => !k.startsWith(KEYS.GRAD_PREFIX) || k === KEYS.GLOBAL_NORM);
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
        ...straggler(ranks),
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

// "rank 1 · running · 210 ms/step (wait 101 ms) · straggler": the pace is the recent median per step.
function rankLabel(r) {
  const pace = r.step_time == null ? "" : ` · ${fmtSeconds(r.step_time)}/step`;
  const wait = r.data_wait == null || r.step_time == null ? "" : ` (wait ${fmtSeconds(r.data_wait)})`;
  return `rank ${r.rank} · ${r.status}${pace}${wait}${r.straggler ? " · straggler" : ""}`;
}

function straggler(ranks) {
  const slow = ranks.find((r) => r.straggler);
  if (!slow) return [];
  return [
    el(
      "span",
      { id: "rank-straggler", class: "badge", title: "the rank the others wait for (its step time or data wait)" },
      `straggler: rank ${slow.rank}`,
    ),
    " ",
  ];
}

function fmtSeconds(s) {
  return s >= 1 ? `${s.toFixed(2)} s` : `${(s * 1000).toPrecision(3)} ms`;
}
