// The runs table's columns (config keys and metric summaries), their sort, the URL that holds the
// table's state, and a windowed renderer so 10,000 rows scroll smoothly (only the rows in view exist).
import { flatten } from "../../lib/config.js";
import { family, num, parseColumn, splitColumns } from "../../lib/contract.js";
import { el } from "../../lib/dom.js";
import { getJSON } from "../../lib/fetch.js";
import { fmtNumber } from "../../lib/format.js";

// The column grammar is the contract's (gradwatch.contract.options): a column name as [kind, path...]:
// ["config", "a.b"], ["summary", key, field] (field may be "at_min(k)"); a list split on its commas.
export { parseColumn, splitColumns };

// The value a run has in a column: a number (NaN/±inf decoded), a string, a boolean, or undefined.
export function columnValue(run, name) {
  const [kind, a, b] = parseColumn(name);
  if (kind === "config") {
    let v = run.config;
    for (const part of a.split(".")) v = v && typeof v === "object" ? v[part] : undefined;
    return v === null ? undefined : v;
  }
  if (kind === "summary") {
    // summary.<key> alone: the runs language's rule (run.summary's value, define_metric's summary, else last)
    const v = b === "" ? (run.run_summary?.[a] ?? run.summary?.[a]?.last) : run.summary?.[a]?.[b];
    return v === null || v === undefined ? undefined : num(v);
  }
  return run[a];
}

export function cellText(v) {
  if (v === undefined) return "";
  if (typeof v === "number") return fmtNumber(v);
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

// Ascending order of two values: numbers (NaN last among them), then strings; missing values always last.
export function compareValues(x, y, desc) {
  const missX = x === undefined || (typeof x === "number" && Number.isNaN(x));
  const missY = y === undefined || (typeof y === "number" && Number.isNaN(y));
  if (missX || missY) return missX === missY ? 0 : missX ? 1 : -1;
  const tx = typeof x === "number" ? 0 : 1,
    ty = typeof y === "number" ? 0 : 1;
  let c = tx - ty;
  if (!c) c = x < y ? -1 : x > y ? 1 : 0;
  return desc ? -c : c;
}

// Config keys whose values differ across the runs (the default columns), at most `limit`.
export function differingConfig(runs, limit = 8) {
  const seen = new Map();
  for (const r of runs) {
    for (const [k, v] of Object.entries(flatten(r.config || {}))) {
      if (!seen.has(k)) seen.set(k, new Set());
      seen.get(k).add(JSON.stringify(v));
    }
  }
  const out = [];
  for (const [k, values] of seen) {
    const everyRunHasIt = runs.every((r) => Object.hasOwn(flatten(r.config || {}), k));
    if (values.size > 1 || (!everyRunHasIt && runs.length > 1)) out.push("config." + k);
  }
  return out.sort().slice(0, limit);
}

// The table's state in the URL (so a view is a link): where, sort, desc, cols, and the plain filters.
const KEYS = ["where", "sort", "desc", "cols", "group", "q", "project", "status", "tag"];
export function readUrl() {
  const p = new URLSearchParams(location.search),
    out = {};
  for (const k of KEYS) if (p.has(k)) out[k] = p.get(k);
  return out;
}
export function writeUrl(state) {
  const p = new URLSearchParams();
  for (const k of KEYS) {
    const v = state[k];
    if (v !== undefined && v !== null && v !== "" && v !== false) p.set(k, v === true ? "1" : v);
  }
  const qs = p.toString();
  history.replaceState(null, "", location.pathname + (qs ? "?" + qs : ""));
}

// A header label that may wrap after its dots and slashes (model.width, val/loss): narrow columns.
function breakable(label) {
  return label.split(/(?<=[./])/).flatMap((part, i) => (i ? [el("wbr"), part] : [part]));
}

export function header(name, onRemove) {
  const [kind, a, b] = parseColumn(name);
  const label = kind === "config" ? a : `${a} ${b}`;
  return el(
    "th",
    { "data-sort": name, "data-col": name, class: kind === "summary" ? "num extra" : "extra", title: name },
    ...breakable(label),
    el(
      "button",
      {
        class: "col-remove",
        title: "remove column",
        "aria-label": "remove column " + name,
        onclick: (ev) => {
          ev.stopPropagation();
          onRemove(name);
        },
      },
      "×",
    ),
  );
}

export function cell(run, name) {
  const v = columnValue(run, name);
  return el("td", { class: typeof v === "number" ? "num extra" : "extra", "data-col": name }, cellText(v));
}

// Windowed rows: only those near the viewport exist, between two spacer rows that keep the height.
const ROW_HEIGHT = 34,
  OVERSCAN = 8,
  ALL_BELOW = 300;
export class Window {
  constructor(tbody, makeRow) {
    this.tbody = tbody;
    this.makeRow = makeRow;
    this.rows = [];
    this.made = new Map();
    this.height = ROW_HEIGHT;
    this.span = [-1, -1];
    let queued = false;
    const onScroll = () => {
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => {
        queued = false;
        this.draw(false);
      });
    };
    addEventListener("scroll", onScroll, { passive: true });
    addEventListener("resize", onScroll, { passive: true });
  }

  set(rows) {
    this.rows = rows;
    this.made = new Map(); // run id -> its row, reused while scrolling (rebuilt when the rows change)
    this.draw(true);
  }

  draw(force) {
    const n = this.rows.length;
    let lo = 0,
      hi = n;
    if (n > ALL_BELOW) {
      const top = this.tbody.getBoundingClientRect().top;
      lo = Math.max(0, Math.floor(-top / this.height) - OVERSCAN);
      hi = Math.min(n, Math.ceil((innerHeight - top) / this.height) + OVERSCAN);
      lo = Math.min(lo, Math.max(0, hi - 2 * OVERSCAN));
    }
    if (!force && lo === this.span[0] && hi === this.span[1]) return;
    this.tbody.parentElement.classList.toggle("virtual", n > ALL_BELOW); // fixed layout: no re-measure per scroll
    this.span = [lo, hi];
    const made = this.rows.slice(lo, hi).map((r) => {
      if (!this.made.has(r.id)) this.made.set(r.id, this.makeRow(r));
      return this.made.get(r.id);
    });
    const spacer = (rows) =>
      el(
        "tr",
        { class: "spacer", "aria-hidden": "true" },
        el("td", { style: `height:${rows * this.height}px;padding:0;border:none` }),
      );
    this.tbody.replaceChildren(...(lo ? [spacer(lo)] : []), ...made, ...(hi < n ? [spacer(n - hi)] : []));
    const first = made[0];
    if (first && n > ALL_BELOW && !this.measured) {
      this.measured = true;
      const h = first.getBoundingClientRect().height;
      if (h > 8 && Math.abs(h - this.height) > 0.5) {
        this.height = h; // rows are taller than assumed (wrapping): measure once, redraw
        this.draw(true);
      }
    }
  }
}

// The "group by" and "+ column" pickers for one project (or all): its config keys, and the min, max and last
// of each metric its runs logged, the script's own first; the hook's system/* keys are no column. Returns
// /api/columns' answer (with the project's run count), or null when it could not be read.
export async function fillPickers(groupBy, addColumn, group, project) {
  let cols;
  try {
    cols = await getJSON("/api/columns" + (project ? "?project=" + encodeURIComponent(project) : ""));
  } catch {
    return null; // the table works without them
  }
  groupBy.replaceChildren(
    el("option", { value: "" }, "no grouping"),
    ...cols.config.map((k) => el("option", { value: k }, "group by " + k)),
  );
  groupBy.value = cols.config.includes(group) ? group : "";
  const metrics = cols.summary.filter((k) => family(k) !== "system");
  metrics.sort((a, b) => (family(a) !== null) - (family(b) !== null) || (a < b ? -1 : 1));
  const options = [
    ...cols.config.map((k) => "config." + k),
    ...metrics.flatMap((k) => ["min", "max", "last"].map((f) => `summary.${k}.${f}`)),
  ];
  addColumn.replaceChildren(
    el("option", { value: "" }, "+ column"),
    ...options.map((o) => el("option", { value: o }, o)),
  );
  return cols;
}
