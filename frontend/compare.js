// Overlay metrics across runs, one chart per metric and one colour per run everywhere; diff configs.
"use strict";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const IDS = (params.get("ids") || "").split(",").map(Number).filter((n) => n > 0);
const C = { runs: [], diff: null, keys: [], panels: [], nextId: 0 };
const label = (r) => r.name + " #" + r.id;
const mode = () => ($("x-mode").value === "relative" ? "wall-relative" : $("x-mode").value);

function syncUrl() {
  const p = new URLSearchParams({ ids: IDS.join(","), keys: C.panels.map((pn) => pn.key).join(","), x: $("x-mode").value });
  if ($("log").checked) p.set("log", "1");
  if (Number($("smoothing").value)) p.set("smooth", $("smoothing").value);
  history.replaceState(null, "", "/compare?" + p.toString());
}

async function load() {
  C.diff = await GW.getJSON("/api/compare?ids=" + IDS.join(","));
  C.runs = C.diff.runs;
  const keyLists = await Promise.all(IDS.map((id) => GW.getJSON(`/api/runs/${id}/keys`)));
  C.keys = [...new Set(keyLists.flat())].sort();
  $("x-mode").value = params.get("x") || "step";
  $("log").checked = params.get("log") === "1";
  $("smoothing").value = params.get("smooth") || "0";
  $("run-list").replaceChildren(...C.runs.map((r) => GW.el("span", {}, GW.el("span", { class: "swatch", style: "background:" + GW.colorFor(r.id) }), GW.el("a", { href: "/runs/" + r.id }, r.name), "  ")));
  renderDiff();
  // `keys=a,b` names the charts; the older single `key=a` still works.
  const wanted = (params.get("keys") || params.get("key") || "").split(",").filter((k) => C.keys.includes(k));
  const first = C.keys.includes("loss") ? "loss" : C.keys[0];
  for (const key of wanted.length ? wanted : first ? [first] : []) addPanel(key);
  // After a reconnect (server restart, network blip) points may have been missed: refetch then.
  let opens = 0;
  const resync = () => { if (++opens > C.runs.length) for (const pn of C.panels) draw(pn); };
  for (const r of C.runs) GW.live("/ws/runs/" + r.id, (msg) => {
    if (msg.type === "resync") { for (const pn of C.panels) draw(pn); return; }  // the page fell behind
    for (const pn of C.panels) onLive(pn, r.id, msg);
  }, resync);
}

// One chart: a metric picker, a remove button and a LiveChart holding one trace per run.
function addPanel(key) {
  const n = C.nextId++;
  const select = GW.el("select", { "aria-label": "metric", class: "panel-key" }, ...C.keys.map((k) => GW.el("option", { value: k }, k)));
  const div = GW.el("div", { id: "chart-" + n, class: "chart", style: "height:360px" });
  const remove = GW.el("button", { class: "panel-remove", title: "remove this chart" }, "×");
  const card = GW.el("div", { class: "card panel" }, GW.el("h3", {}, select, " ", remove), div);
  $("panels").append(card);
  const pn = { key, select, div, card, series: {}, fresh: {}, buffer: [], loading: true, timer: null,
    chart: new LiveChart(div, { t0: () => 0, smoothing: () => Number($("smoothing").value), log: () => $("log").checked,
      empty: "None of these runs logged this metric.", redraw: () => pn.chart.render(entries(pn), mode()) }) };
  pn.chart.xOf = (s, i, m) => (m === "step" ? s.steps[i] : m === "wall" ? new Date(s.walls[i] * 1000) : s.walls[i] - s.t0);
  select.value = key;
  select.addEventListener("change", () => { pn.key = select.value; draw(pn); });
  remove.addEventListener("click", () => { C.panels.splice(C.panels.indexOf(pn), 1); Plotly.purge(div); card.remove(); syncUrl(); });
  C.panels.push(pn);
  draw(pn);
  return pn;
}

const entries = (pn) => C.runs.filter((r) => pn.series[r.id]).map((r) => ({ label: label(r), color: GW.colorFor(r.id), series: pn.series[r.id] }));

async function draw(pn) {
  pn.loading = true; pn.buffer = [];
  const key = pn.key;
  const fetched = await Promise.all(C.runs.map(async (r) => {
    try {
      const s = await GW.getJSON(`/api/runs/${r.id}/series?key=${encodeURIComponent(key)}&max_points=4000`);
      return [r.id, { steps: s.steps, values: s.values.map(GW.num), walls: s.wall_times, t0: s.wall_times.length ? s.wall_times[0] : 0 }];
    } catch (e) { return [r.id, null]; }  // this run never logged the key
  }));
  if (key !== pn.key) return;  // the picker changed while fetching; the newer draw wins
  pn.series = Object.fromEntries(fetched.filter(([, s]) => s));
  pn.loading = false;
  pn.chart.render(entries(pn), mode());
  syncUrl();
  for (const [id, msg] of pn.buffer) onLive(pn, id, msg);
  pn.buffer = [];
}

// Live: a compared run's new points of the panel's metric are appended, one redraw per ~200 ms.
function onLive(pn, id, msg) {
  if (pn.loading) { pn.buffer.push([id, msg]); return; }
  const pts = msg.type === "points" && msg.series[pn.key];
  if (!pts) return;
  const r = C.runs.find((x) => x.id === id);
  const s = pn.series[id] || (pn.series[id] = { steps: [], values: [], walls: [], t0: pts.wall_times[0] });
  const last = s.steps.length ? s.steps[s.steps.length - 1] : -Infinity, from = s.steps.length;
  pts.steps.forEach((step, i) => { if (step > last) { s.steps.push(step); s.values.push(GW.num(pts.values[i])); s.walls.push(pts.wall_times[i]); } });
  if (s.steps.length > from && pn.fresh[label(r)] === undefined) pn.fresh[label(r)] = from;
  if (!pn.timer) pn.timer = setTimeout(() => flushPanel(pn), 200);
}

function flushPanel(pn) {
  pn.timer = null;
  const fresh = pn.fresh; pn.fresh = {};
  let compacted = false;  // same budget as the run page: fold long live series back with the envelope
  for (const id of Object.keys(pn.series)) {
    if (pn.series[id].steps.length > 8000) { pn.series[id] = GW.compact(pn.series[id], 4000); compacted = true; }
  }
  if (compacted) pn.chart.render(entries(pn), mode()); else pn.chart.extend(entries(pn), fresh, mode());
}

function renderDiff() {
  const only = $("only-diff").checked;
  const head = GW.el("tr", {}, GW.el("th", {}, "key"), ...C.runs.map((r) => GW.el("th", {}, GW.el("span", { class: "swatch", style: "background:" + GW.colorFor(r.id) }), r.name)));
  const rows = C.diff.rows.filter((row) => !only || row.differs).map((row) => GW.el("tr", { class: row.differs ? "differs" : "" },
    GW.el("td", {}, row.key), ...row.values.map((v) => GW.el("td", {}, v === null || v === undefined ? "—" : typeof v === "object" ? JSON.stringify(v) : String(v)))));
  $("diff").replaceChildren(head, ...rows);
}

const redrawAll = () => { for (const pn of C.panels) pn.chart.render(entries(pn), mode()); syncUrl(); };
for (const id of ["x-mode", "log", "smoothing"]) $(id).addEventListener("change", redrawAll);
$("only-diff").addEventListener("change", renderDiff);
$("add-chart").addEventListener("click", () => {
  const shown = new Set(C.panels.map((pn) => pn.key));
  addPanel(C.keys.find((k) => !shown.has(k)) || C.keys[0]);
});
$("share").addEventListener("click", async () => {
  syncUrl();
  try { await navigator.clipboard.writeText(location.href); $("share").textContent = "Link copied"; } catch (e) { prompt("Share this link", location.href); }
});
if (IDS.length) load(); else $("panels").replaceChildren(GW.el("p", { class: "muted" }, "Pick runs to compare on the runs list."));
