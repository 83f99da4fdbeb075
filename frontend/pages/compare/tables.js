// The compare page's tables: a summary per run (status, steps, duration, last and best loss,
// alerts) beside the config diff.
import { el } from "../../lib/dom.js";
import { fmtDuration, fmtNumber } from "../../lib/format.js";
import { colorFor } from "../../lib/plot.js";

const swatch = (id) => el("span", { class: "swatch", style: "background:" + colorFor(id) });

function lossStats(s) {
  if (!s?.values.length) return { last: null, best: null };
  const finite = s.values.filter((v) => Number.isFinite(v));
  return { last: s.values[s.values.length - 1], best: finite.length ? Math.min(...finite) : null };
}

function duration(r) {
  const end = r.finished_at || (r.status === "running" ? Date.now() / 1000 : r.updated_at);
  return end && r.created_at ? end - r.created_at : null;
}

// losses: run id -> {steps, values} (an envelope keeps each bucket's min, so "best" is exact);
// alertCounts: run id -> number of alerts, as the runs list counts them (a repeat is not another).
export function renderSummary(table, runs, losses, alertCounts) {
  const head = el(
    "tr",
    {},
    ...["run", "status", "steps", "duration", "last loss", "best loss", "alerts"].map((h, i) =>
      el("th", { class: i > 1 ? "num" : "" }, h),
    ),
  );
  const rows = runs.map((r) => {
    const { last, best } = lossStats(losses[r.id]);
    return el(
      "tr",
      { "data-run": r.id },
      el("td", {}, swatch(r.id), el("a", { href: "/runs/" + r.id }, r.name), " #" + r.id),
      el("td", {}, el("span", { class: "status " + r.status }, r.status)),
      el("td", { class: "num" }, r.last_step ?? ""),
      el("td", { class: "num" }, fmtDuration(duration(r))),
      el("td", { class: "num last-loss" }, fmtNumber(last)),
      el("td", { class: "num best-loss" }, fmtNumber(best)),
      el("td", { class: "num alert-total" }, alertCounts[r.id] ?? r.alert_count ?? 0),
    );
  });
  table.replaceChildren(head, ...rows);
}

export function renderDiff(table, runs, diff, onlyDiffering) {
  const head = el("tr", {}, el("th", {}, "key"), ...runs.map((r) => el("th", {}, swatch(r.id), r.name)));
  const rows = diff.rows
    .filter((row) => !onlyDiffering || row.differs)
    .map((row) =>
      el(
        "tr",
        { class: row.differs ? "differs" : "" },
        el("td", {}, row.key),
        ...row.values.map((v) =>
          el("td", {}, v === null || v === undefined ? "—" : typeof v === "object" ? JSON.stringify(v) : fmtNumber(v)),
        ),
      ),
    );
  table.replaceChildren(head, ...rows);
}
