// The runs list: filters (the runs language too), config and summary columns, sorting, live status, alert
// badges, loss sparklines, selection for comparison, edits. The table's state lives in the URL.
import { STATUSES } from "../lib/contract.js";
import { $, el, throttle } from "../lib/dom.js";
import { getJSON, turns } from "../lib/fetch.js";
import { fmtNumber, fmtShortTime, fmtTime } from "../lib/format.js";
import { live } from "../lib/live.js";
import { colorFor } from "../lib/plot.js";
import { sparkline } from "../lib/sparkline.js";
import { attentionLines } from "./index/attention.js";
import { groupItems, groupRow, groupRuns, sortGroups } from "./index/groups.js";
import {
  cell,
  columnValue,
  compareValues,
  differingConfig,
  fillPickers,
  header,
  readUrl,
  splitColumns,
  Window,
  writeUrl,
} from "./index/runs_table.js";

const url = readUrl();
const state = {
  runs: new Map(),
  sort: url.sort || "created_at",
  desc: url.desc ? url.desc === "1" : !url.sort,
  selected: new Set(),
  sparks: new Map(),
  where: url.where || "",
  cols: url.cols !== undefined ? splitColumns(url.cols) : null, // null: the config keys that differ
  group: url.group || "", // a config key: one row per value (groups.groupRuns)
  expanded: new Set(), // the groups showing their runs
  menuFor: null, // the run whose row menu is open
  incidents: [], // the open incidents (the inbox's order: critical first), for the banner
  projects: [], // every project's name (/api/columns): the filter offers them under a where filter too
  scopeCount: null, // how many runs the chosen project has (/api/columns), for "6 of 7 runs" under a filter
};
let table = null;

// One request: the runs (filtered by the where box on the server) with the summaries the columns show.
const loadTurn = turns(); // an answer that comes after a newer load's is dropped
async function load() {
  const mine = loadTurn();
  const params = new URLSearchParams();
  const summaryCols = (state.cols || []).filter((c) => c.startsWith("summary."));
  if (summaryCols.length) params.set("columns", summaryCols.join(","));
  if (state.where) params.set("where", state.where);
  let runs;
  try {
    runs = await getJSON("/api/runs" + (params.size ? "?" + params : ""));
    if (!mine()) return;
    $("where-error").textContent = "";
    $("where-error").hidden = true;
  } catch (e) {
    if (!mine()) return;
    if (e.status !== 400) throw e;
    $("where-error").textContent = e.message; // one line that points at the column
    $("where-error").hidden = false;
    return;
  }
  state.runs = new Map(runs.map((r) => [r.id, { ...r, config_loaded: true }]));
  render(); // rows in view ask for their sparklines as they are made (wantSpark)
  loadIncidents();
}
const reload = throttle(load, 3000, 1);

// The open incidents, worst first, for the banner (which shows those of the runs in view).
async function loadIncidents() {
  try {
    state.incidents = await getJSON("/api/incidents?status=open");
  } catch {
    return; // the banner falls back on each run's newest alert
  }
  renderAttention(visible());
}
const reloadIncidents = throttle(loadIncidents, 3000, 1);

// The pickers and the run count follow the project: its config keys and metrics only.
async function loadPickers() {
  const project = $("f-project").value;
  const cols = await fillPickers($("group-by"), $("add-column"), state.group, project);
  if (!cols || project !== $("f-project").value) return;
  state.scopeCount = cols.runs;
  state.projects = cols.projects || [];
  if (state.group && !cols.config.includes(state.group)) state.group = "";
  if (state.runs.size) render(); // before the first load there is nothing to count yet
}

// Latest loss and a small loss curve per row, only for the rows the table draws (those in view): the
// rows made in one frame share one request at once (not after the 3 s refresh throttle: that made the
// first curves take > 3 s), and while runs make progress the drawn rows refresh at most every 3 s.
const SPARK_POINTS = 40; // a 120 px curve: 3,000 points would be 25 per pixel
const sparkWanted = new Set();
const sparkAsked = new Set(); // ids whose curve is on its way: a row drawn again meanwhile is filled by that answer
let sparkFrame = 0;
function wantSpark(id) {
  if (state.sparks.has(id)) return fillSpark(id);
  if (sparkAsked.has(id)) return;
  sparkWanted.add(id);
  if (sparkFrame) return;
  sparkFrame = requestAnimationFrame(() => {
    sparkFrame = 0;
    const ids = [...sparkWanted];
    sparkWanted.clear();
    loadSparks(ids);
  });
}

async function loadSparks(ids) {
  if (!ids.length) return;
  let out;
  for (const id of ids) sparkAsked.add(id);
  try {
    out = await getJSON(`/api/sparklines?ids=${ids.join(",")}&key=loss&points=${SPARK_POINTS}`);
  } catch {
    return; // a list without curves still works
  } finally {
    for (const id of ids) sparkAsked.delete(id);
  }
  for (const [id, s] of Object.entries(out.runs)) state.sparks.set(Number(id), s);
  for (const id of ids) fillSpark(id);
}
const drawnRuns = () => [...document.querySelectorAll("#runs tbody tr[data-run]")].map((tr) => Number(tr.dataset.run));
const refreshSparks = throttle(() => loadSparks(drawnRuns().slice(0, 200)), 3000, 1);

function fillSpark(id) {
  const tr = document.querySelector(`tr[data-run="${id}"]`);
  if (!tr) return;
  const s = state.sparks.get(id),
    values = s ? s.values.map(Number) : [];
  const latest = s?.values.length ? s.values[s.values.length - 1] : null;
  tr.querySelector(".latest-loss").textContent = latest === null ? "" : fmtNumber(latest);
  tr.querySelector(".spark").replaceChildren(...(s ? [sparkline(s.steps, values, colorFor(id))] : []));
}

function visible() {
  const name = $("f-name").value.toLowerCase(),
    project = $("f-project").value;
  const status = $("f-status").value,
    tag = $("f-tag").value.trim();
  const rows = [...state.runs.values()].filter(
    (r) =>
      (!name || r.name.toLowerCase().includes(name)) &&
      (!project || r.project === project) &&
      (!status || r.status === status) &&
      (!tag || r.tags.includes(tag)),
  );
  const k = state.sort,
    dir = state.desc ? -1 : 1;
  if (k.includes(".")) {
    rows.sort((a, b) => compareValues(columnValue(a, k), columnValue(b, k), state.desc) || b.id - a.id);
    return rows;
  }
  rows.sort((a, b) =>
    (a[k] ?? -Infinity) > (b[k] ?? -Infinity) ? dir : (a[k] ?? -Infinity) < (b[k] ?? -Infinity) ? -dir : b.id - a.id,
  );
  return rows;
}

function columns(rows) {
  return state.cols ?? differingConfig(rows);
}

function setColumns(cols) {
  const needsSummaries = cols.some((c) => c.startsWith("summary.") && !(state.cols || []).includes(c));
  state.cols = cols;
  if (needsSummaries) load();
  else render();
}

function renderProjects() {
  const sel = $("f-project"),
    current = sel.value;
  const projects = [...new Set([...state.projects, ...[...state.runs.values()].map((r) => r.project)])].sort();
  sel.replaceChildren(
    el("option", { value: "" }, "all projects"),
    ...projects.map((p) => el("option", { value: p }, p)),
  );
  sel.value = projects.includes(current) ? current : "";
}

function row(r, extras) {
  const box = el("input", { type: "checkbox", "aria-label": "select " + r.name });
  box.checked = state.selected.has(r.id);
  box.addEventListener("change", () => {
    box.checked ? state.selected.add(r.id) : state.selected.delete(r.id);
    updateCompare();
  });
  // The edits sit in a row menu (one narrow column): the table fits a 1440 px screen with its columns.
  const act = (fn) => () => {
    state.menuFor = null;
    fn();
  };
  const menu = el(
    "details",
    { class: "row-menu" },
    el("summary", { title: "rename, tag, note, delete", "aria-label": "actions for " + r.name }, "⋯"),
    el(
      "div",
      { class: "menu" },
      el("button", { onclick: act(() => edit(r, "name")), title: "rename", "data-needs": "edit" }, "Rename"),
      el("button", { onclick: act(() => edit(r, "tags")), title: "edit tags", "data-needs": "edit" }, "Tags"),
      el("button", { onclick: act(() => edit(r, "notes")), title: "edit note", "data-needs": "edit" }, "Note"),
      el("button", { class: "danger", onclick: act(() => remove(r)), "data-needs": "admin" }, "Delete"),
    ),
  );
  // An open menu stays open when a live update redraws its row; one menu is open at a time.
  menu.open = state.menuFor === r.id;
  menu.addEventListener("toggle", () => {
    if (menu.open) {
      state.menuFor = r.id;
      for (const other of document.querySelectorAll("#runs details.row-menu[open]"))
        if (other !== menu) other.open = false;
    } else if (state.menuFor === r.id) state.menuFor = null;
  });
  const actions = el("td", { class: "row-actions" }, menu);
  return el(
    "tr",
    { "data-run": r.id, class: state.group ? "in-group" : "" },
    el("td", {}, box),
    el(
      "td",
      {},
      el("span", { class: "swatch", style: "background:" + colorFor(r.id) }),
      el("a", { href: "/runs/" + r.id }, r.name),
    ),
    el("td", {}, r.project),
    el("td", {}, el("span", { class: "status " + r.status }, r.status)),
    el(
      "td",
      {},
      r.alert_count ? el("span", { class: "badge", title: "alerts" }, r.alert_count) : "",
      r.open_incidents
        ? el(
            "a",
            { class: "incident-count", href: inboxHref(r.project), title: "open incidents" },
            r.open_incidents + " open",
          )
        : "",
    ),
    el("td", { class: "started", title: fmtTime(r.created_at) }, fmtShortTime(r.created_at)),
    el("td", { class: "last-step" }, r.last_step ?? ""),
    ...extras.map((c) => cell(r, c)),
    el("td", { class: "latest-loss num" }),
    el("td", { class: "spark" }),
    el("td", {}, ...r.tags.map((t) => el("span", { class: "chip" }, t))),
    el("td", { class: "muted notes", title: r.notes }, r.notes),
    actions,
  );
}

const inboxHref = (project) => "/inbox" + (project ? "?project=" + encodeURIComponent(project) : "");

// The banner: the runs in view (project and filters) that need a look, critical first, one line each.
function renderAttention(rows) {
  const width = $("attention").clientWidth || innerWidth - 40;
  $("attention").replaceChildren(...attentionLines(rows, state.incidents, width, inboxHref($("f-project").value)));
}

function render() {
  renderProjects();
  const rows = visible();
  renderAttention(rows);
  const extras = columns(rows);
  const heads = $("runs").querySelector("thead tr");
  for (const th of heads.querySelectorAll("th.extra")) th.remove();
  $("th-last-step").after(...extras.map((c) => header(c, (gone) => setColumns(extras.filter((x) => x !== gone)))));
  for (const th of heads.querySelectorAll("th[data-sort]"))
    th.setAttribute("aria-sort", th.dataset.sort === state.sort ? (state.desc ? "descending" : "ascending") : "none");
  const runRow = (r) => {
    const tr = row(r, extras);
    queueMicrotask(() => wantSpark(r.id));
    return tr;
  };
  if (state.group) {
    const groups = sortGroups(groupRuns(rows, state.group, extras), state.sort, state.desc);
    const toggle = (id) => {
      state.expanded.has(id) ? state.expanded.delete(id) : state.expanded.add(id);
      render();
    };
    table.makeRow = (it) =>
      it.runs ? groupRow(it, state.group, extras, state.expanded.has(it.id), toggle) : runRow(it);
    table.set(groupItems(groups, state.expanded));
  } else {
    table.makeRow = runRow;
    table.set(rows);
  }
  $("compare-groups").hidden = !state.group;
  writeUrl({
    where: state.where,
    sort: state.sort === "created_at" && state.desc ? "" : state.sort,
    desc: state.sort === "created_at" && state.desc ? "" : state.desc ? "1" : "0",
    cols: state.cols === null ? undefined : state.cols.join(","),
    group: state.group,
    q: $("f-name").value,
    project: $("f-project").value,
    status: $("f-status").value,
    tag: $("f-tag").value,
  });
  $("empty").hidden = state.runs.size > 0;
  // "6 of 7 runs": of the chosen project's runs (under a where filter the list holds only those that match,
  // so the project's count comes from /api/columns).
  const project = $("f-project").value;
  const inScope = project ? [...state.runs.values()].filter((r) => r.project === project).length : state.runs.size;
  const total = state.where && state.scopeCount !== null ? Math.max(state.scopeCount, inScope) : inScope;
  $("count").textContent = `${rows.length} of ${total} runs` + (project ? ` in ${project}` : "");
  $("inbox-link").href = inboxHref(project);
  $("runs").classList.toggle("one-project", Boolean(project));
  updateCompare();
}

function updateCompare() {
  const n = state.selected.size;
  $("compare").disabled = n < 1;
  $("compare").textContent = "Compare selected (" + n + ")";
  $("compare").title = n ? "" : "tick the runs to compare first";
}

async function patch(id, body) {
  const run = await getJSON("/api/runs/" + id, {
    method: "PATCH",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  state.runs.set(id, run);
  render();
}

async function edit(r, field) {
  const current = field === "tags" ? r.tags.join(", ") : r[field];
  const value = prompt(field === "tags" ? "Tags (comma separated)" : field === "name" ? "New name" : "Note", current);
  if (value === null) return;
  const body = {
    [field]:
      field === "tags"
        ? value
            .split(",")
            .map((t) => t.trim())
            .filter(Boolean)
        : value,
  };
  try {
    await patch(r.id, body);
  } catch (e) {
    alert("Could not save: " + e.message);
  }
}

async function remove(r) {
  if (!confirm("Delete run '" + r.name + "' and all its data?")) return;
  await getJSON("/api/runs/" + r.id, { method: "DELETE" });
  state.runs.delete(r.id);
  state.selected.delete(r.id);
  render();
}

let pending = null;
function scheduleRender() {
  if (!pending)
    pending = setTimeout(() => {
      pending = null;
      render();
    }, 250);
}

function onLive(msg) {
  if (msg.type === "run") {
    const isNew = !state.runs.has(msg.run.id);
    const old = state.runs.get(msg.run.id);
    state.runs.set(msg.run.id, { config: {}, summary: {}, ...old, ...msg.run }); // pushes carry no config
    scheduleRender();
    if (isNew) refreshSparks();
    if (msg.run.open_incidents !== old?.open_incidents || msg.run.alert_count !== old?.alert_count) reloadIncidents();
  } else if (msg.type === "deleted") {
    state.runs.delete(msg.id);
    scheduleRender();
  } else if (msg.type === "progress") {
    const r = state.runs.get(msg.id);
    if (r && msg.last_step !== null) {
      r.last_step = msg.last_step;
      const cell = document.querySelector(`tr[data-run="${msg.id}"] .last-step`);
      if (cell) cell.textContent = msg.last_step;
    }
    refreshSparks();
  } else if (msg.type === "resync") load();
  // Pushes carry no config or summaries: a new run, or one under a filter or summary column, is read again.
  const known = msg.type === "run" && state.runs.get(msg.run.id)?.config_loaded;
  if (msg.type === "run" && (!known || state.where || (state.cols || []).some((c) => c.startsWith("summary."))))
    reload();
}

// The status filter offers every status a run can have (one list, from /contract.js).
$("f-status").append(...STATUSES.map((s) => el("option", {}, s)));
for (const id of ["f-name", "f-project", "f-status", "f-tag"]) $(id).addEventListener("input", render);
$("f-project").addEventListener("change", () => {
  state.scopeCount = null;
  loadPickers();
});
$("runs")
  .querySelector("thead")
  .addEventListener("click", (ev) => {
    const th = ev.target.closest("th[data-sort]");
    if (!th) return;
    state.desc = state.sort === th.dataset.sort ? !state.desc : true;
    state.sort = th.dataset.sort;
    render();
  });
$("f-where").value = state.where;
$("f-where").addEventListener("keydown", (ev) => {
  if (ev.key !== "Enter") return;
  state.where = $("f-where").value.trim();
  load();
});
$("group-by").addEventListener("change", () => {
  state.group = $("group-by").value;
  state.expanded.clear();
  render();
});
$("compare-groups").addEventListener("click", () => {
  const p = new URLSearchParams({ group: state.group });
  const metric = (state.cols || []).find((c) => c.startsWith("summary."));
  p.set("key", metric ? metric.slice(8, metric.lastIndexOf(".")) : "loss");
  if ($("f-project").value) p.set("project", $("f-project").value);
  const ids = visible().map((r) => r.id);
  if (state.where) p.set("where", state.where);
  else if (!$("f-project").value || ids.length < state.runs.size) p.set("ids", ids.join(","));
  location.href = "/compare?" + p;
});
$("add-column").addEventListener("change", () => {
  const c = $("add-column").value;
  $("add-column").value = "";
  const cols = columns(visible());
  if (c && !cols.includes(c)) setColumns([...cols, c]);
});
for (const k of ["q", "project", "status", "tag"]) {
  if (url[k]) {
    const id = k === "q" ? "f-name" : "f-" + k;
    if (k === "project") $(id).append(el("option", { value: url[k] }, url[k]));
    $(id).value = url[k];
  }
}
table = new Window($("runs").querySelector("tbody"), (r) => row(r, []));
loadPickers();
$("compare").addEventListener("click", () => {
  location.href = "/compare?ids=" + [...state.selected].join(",");
});
live("/ws/runs", onLive, load);
