// The runs list: filters (the runs language too), config and summary columns, sorting, live status, alert
// badges, loss sparklines, selection for comparison, edits. The table's state lives in the URL.
import { STATUSES } from "../lib/contract.js";
import { $, el, throttle } from "../lib/dom.js";
import { getJSON } from "../lib/fetch.js";
import { fmtNum, fmtTime } from "../lib/format.js";
import { live } from "../lib/live.js";
import { colorFor } from "../lib/plot.js";
import { sparkline } from "../lib/sparkline.js";
import {
  cell,
  columnValue,
  compareValues,
  differingConfig,
  fillPickers,
  groupRow,
  groupRuns,
  header,
  readUrl,
  sortGroups,
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
  group: url.group || "", // a config key: one row per value (runs_table.groupRuns)
};
let table = null;

// One request: the runs (filtered by the where box on the server) with the summaries the columns show.
async function load() {
  const params = new URLSearchParams();
  const summaryCols = (state.cols || []).filter((c) => c.startsWith("summary."));
  if (summaryCols.length) params.set("columns", summaryCols.join(","));
  if (state.where) params.set("where", state.where);
  let runs;
  try {
    runs = await getJSON("/api/runs" + (params.size ? "?" + params : ""));
    $("where-error").textContent = "";
    $("where-error").hidden = true;
  } catch (e) {
    if (e.status !== 400) throw e;
    $("where-error").textContent = e.message; // one line that points at the column
    $("where-error").hidden = false;
    return;
  }
  state.runs = new Map(runs.map((r) => [r.id, { ...r, config_loaded: true }]));
  render(); // rows in view ask for their sparklines as they are made (wantSpark)
}
const reload = throttle(load, 3000, 1);

// Latest loss and a small loss curve per row, only for the rows the table draws (those in view): the
// rows made in one frame share one request at once (not after the 3 s refresh throttle: that made the
// first curves take > 3 s), and while runs make progress the drawn rows refresh at most every 3 s.
const SPARK_POINTS = 40; // a 120 px curve: 3,000 points would be 25 per pixel
const sparkWanted = new Set();
let sparkFrame = 0;
function wantSpark(id) {
  if (state.sparks.has(id)) return fillSpark(id);
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
  try {
    out = await getJSON(`/api/sparklines?ids=${ids.join(",")}&key=loss&points=${SPARK_POINTS}`);
  } catch {
    return;
  } // a list without curves still works
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
  tr.querySelector(".latest-loss").textContent =
    latest === null ? "" : fmtNum(typeof latest === "string" ? latest : Number(latest));
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
  const projects = [...new Set([...state.runs.values()].map((r) => r.project))].sort();
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
  const actions = el(
    "td",
    {},
    el("button", { onclick: () => edit(r, "name"), title: "rename", "data-needs": "edit" }, "Rename"),
    " ",
    el("button", { onclick: () => edit(r, "tags"), title: "edit tags", "data-needs": "edit" }, "Tags"),
    " ",
    el("button", { onclick: () => edit(r, "notes"), title: "edit note", "data-needs": "edit" }, "Note"),
    " ",
    el("button", { class: "danger", onclick: () => remove(r), "data-needs": "admin" }, "Delete"),
  );
  return el(
    "tr",
    { "data-run": r.id },
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
        ? el("a", { class: "incident-count", href: "/inbox", title: "open incidents" }, r.open_incidents + " open")
        : "",
    ),
    el("td", {}, fmtTime(r.created_at)),
    el("td", { class: "last-step" }, r.last_step ?? ""),
    ...extras.map((c) => cell(r, c)),
    el("td", { class: "latest-loss num" }),
    el("td", { class: "spark" }),
    el("td", {}, ...r.tags.map((t) => el("span", { class: "chip" }, t))),
    el("td", { class: "muted" }, r.notes.length > 60 ? r.notes.slice(0, 60) + "…" : r.notes),
    actions,
  );
}

// Runs that need a look: running ones with alerts, and any run that failed, crashed or alerted in the last day.
function renderAttention() {
  const day = Date.now() / 1000 - 86400;
  const runs = [...state.runs.values()]
    .filter(
      (r) =>
        (r.last_alert && (r.status === "running" || r.last_alert.created_at > day)) ||
        ((r.status === "failed" || r.status === "crashed") && r.updated_at > day),
    )
    .sort(
      (a, b) =>
        (b.last_alert ? b.last_alert.created_at : b.updated_at) -
        (a.last_alert ? a.last_alert.created_at : a.updated_at),
    )
    .slice(0, 5);
  $("attention").replaceChildren(
    ...runs.map((r) => {
      const a = r.last_alert;
      return el(
        "div",
        { class: "alert " + (a ? a.severity : "critical"), "data-run": r.id, "data-kind": a ? a.kind : r.status },
        el("a", { href: "/runs/" + r.id }, r.name),
        " ",
        el("b", {}, a ? a.kind : r.status),
        el(
          "span",
          { class: "muted" },
          a
            ? "step " +
                (a.step ?? "?") +
                (a.layer ? " · " + a.layer : "") +
                (r.open_incidents > 1 ? " · " + r.open_incidents + " open incidents" : "") +
                " · "
            : "",
        ),
        a
          ? a.message.length > 160
            ? a.message.slice(0, 160) + "…"
            : a.message
          : "the training process " + (r.status === "failed" ? "raised an exception" : "stopped reporting"),
      );
    }),
  );
}

function render() {
  renderProjects();
  renderAttention();
  const rows = visible();
  const extras = columns(rows);
  const heads = $("runs").querySelector("thead tr");
  for (const th of heads.querySelectorAll("th.extra")) th.remove();
  $("th-last-step").after(...extras.map((c) => header(c, (gone) => setColumns(extras.filter((x) => x !== gone)))));
  for (const th of heads.querySelectorAll("th[data-sort]"))
    th.setAttribute("aria-sort", th.dataset.sort === state.sort ? (state.desc ? "descending" : "ascending") : "none");
  if (state.group) {
    const groups = sortGroups(groupRuns(rows, state.group, extras), state.sort, state.desc);
    table.makeRow = (g) => groupRow(g, state.group, extras, 4);
    table.set(groups);
  } else {
    table.makeRow = (r) => {
      const tr = row(r, extras);
      queueMicrotask(() => wantSpark(r.id));
      return tr;
    };
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
  $("count").textContent = rows.length + " of " + state.runs.size + " runs";
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
fillPickers($("group-by"), $("add-column"), state.group);
$("compare").addEventListener("click", () => {
  location.href = "/compare?ids=" + [...state.selected].join(",");
});
live("/ws/runs", onLive, load);
