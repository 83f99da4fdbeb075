// The runs table grouped by a config key: one row per value, its cells under the same headers as a run's
// (aggregates under their own columns), ordered by value (numbers numerically), each expandable to its runs.
import { el } from "../../lib/dom.js";
import { fmtNumber } from "../../lib/format.js";
import { cellText, columnValue, compareValues } from "./runs_table.js";

const isNum = (v) => typeof v === "number" && Number.isFinite(v);

function meanStd(nums) {
  const mean = nums.reduce((a, b) => a + b, 0) / nums.length;
  const sd = nums.length > 1 ? Math.sqrt(nums.reduce((a, b) => a + (b - mean) ** 2, 0) / (nums.length - 1)) : 0;
  return { mean, sd };
}

// A summary column over a group: mean ± std of the runs that have it (n, min and max on hover).
function summaryCell(values) {
  const nums = values.filter(isNum);
  if (!nums.length) return { text: "" };
  const { mean, sd } = meanStd(nums);
  const title = `n=${nums.length}, min ${fmtNumber(Math.min(...nums))}, max ${fmtNumber(Math.max(...nums))}`;
  const spread = nums.length > 1 ? " ± " + fmtNumber(Number(sd.toPrecision(2))) : ""; // two digits say how wide
  return { sort: mean, text: fmtNumber(mean) + spread, title, num: true };
}

// A config column over a group: the value all its runs share, else the range (numbers) or how many values.
function configCell(values) {
  const distinct = [...new Set(values.map((v) => JSON.stringify(v)))];
  if (distinct.length === 1) return { sort: values[0], text: cellText(values[0]), num: isNum(values[0]) };
  const nums = values.filter(isNum);
  if (nums.length === values.length) {
    const lo = Math.min(...nums),
      hi = Math.max(...nums);
    return { sort: lo, text: `${fmtNumber(lo)} – ${fmtNumber(hi)}`, title: `${distinct.length} values`, num: true };
  }
  return { text: `${distinct.length} values`, title: distinct.join(", ") };
}

// How many runs of each status, the commonest first ("3 finished · 1 running").
function statusText(runs) {
  const counts = new Map();
  for (const r of runs) counts.set(r.status, (counts.get(r.status) || 0) + 1);
  if (counts.size === 1) return runs[0].status;
  return [...counts]
    .sort((a, b) => b[1] - a[1])
    .map(([s, n]) => `${n} ${s}`)
    .join(" · ");
}

export function groupLabel(v) {
  return v === undefined
    ? "(none)"
    : typeof v === "string"
      ? v
      : typeof v === "number"
        ? fmtNumber(v)
        : JSON.stringify(v);
}

// One group per value of config ``key`` among ``runs`` (kept in their order), with a cell per column.
export function groupRuns(runs, key, cols) {
  const groups = new Map();
  for (const r of runs) {
    const v = columnValue(r, "config." + key);
    const id = JSON.stringify(v ?? null);
    if (!groups.has(id)) groups.set(id, { id: "group:" + id, label: groupLabel(v), value: v, runs: [] });
    groups.get(id).runs.push(r);
  }
  for (const g of groups.values()) {
    g.cells = {};
    for (const c of cols) {
      const values = g.runs.map((r) => columnValue(r, c));
      g.cells[c] = c.startsWith("summary.") ? summaryCell(values) : configCell(values);
    }
    g.alerts = g.runs.reduce((n, r) => n + (r.alert_count || 0), 0);
    g.lastStep = Math.max(...g.runs.map((r) => r.last_step ?? -1));
  }
  return [...groups.values()];
}

// Groups by an aggregated column when the table is sorted by one; otherwise by their value, ascending.
export function sortGroups(groups, sort, desc) {
  const agg = { alert_count: (g) => g.alerts, last_step: (g) => g.lastStep, count: (g) => g.runs.length };
  const key = sort in agg ? agg[sort] : (g) => (sort in g.cells ? g.cells[sort].sort : g.value);
  const down = sort in agg || sort in (groups[0]?.cells || {}) || sort === "name" ? desc : false;
  return groups.sort((a, b) => compareValues(key(a), key(b), down) || (a.label < b.label ? -1 : 1));
}

// The rows the table shows: each group, followed by its runs when it is expanded.
export function groupItems(groups, expanded) {
  return groups.flatMap((g) => (expanded.has(g.id) ? [g, ...g.runs] : [g]));
}

// A group's row: one cell per header, in the run row's order (select, name, project, status, alerts,
// started, last step, the extra columns, loss, loss curve, tags, notes, actions); clicking it expands it.
export function groupRow(g, key, extras, open, onToggle) {
  const projects = new Set(g.runs.map((r) => r.project));
  const toggle = el(
    "button",
    { class: "group-toggle", "aria-expanded": String(open), "aria-label": (open ? "collapse " : "expand ") + g.label },
    open ? "▾" : "▸",
  );
  const tr = el(
    "tr",
    { class: "group-row" + (open ? " open" : ""), "data-group": g.label },
    el("td", {}, toggle),
    el("td", {}, el("b", {}, `${key} = ${g.label}`), el("span", { class: "muted" }, ` · ${g.runs.length} runs`)),
    el("td", {}, projects.size === 1 ? g.runs[0].project : `${projects.size} projects`),
    el("td", { class: "muted" }, statusText(g.runs)),
    el("td", {}, g.alerts ? el("span", { class: "badge", title: "alerts in the group" }, g.alerts) : ""),
    el("td", {}),
    el("td", { class: "last-step" }, g.lastStep >= 0 ? g.lastStep : ""),
    ...extras.map((c) => {
      const cell = g.cells[c];
      return el("td", { class: cell.num ? "extra num" : "extra", "data-col": c, title: cell.title || "" }, cell.text);
    }),
    el("td", {}),
    el("td", {}),
    el("td", {}),
    el("td", {}),
    el("td", {}),
  );
  tr.addEventListener("click", (ev) => {
    if (!ev.target.closest("a")) onToggle(g.id);
  });
  return tr;
}
