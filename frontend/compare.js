// Overlay one metric across runs (one colour per run everywhere) and diff their configs.
"use strict";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const IDS = (params.get("ids") || "").split(",").map(Number).filter((n) => n > 0);
const C = { runs: [], diff: null, series: {} };
const chart = new LiveChart($("chart"), { t0: () => 0, smoothing: () => Number($("smoothing").value), log: () => $("log").checked });

function syncUrl() {
  const p = new URLSearchParams({ ids: IDS.join(","), key: $("key").value, x: $("x-mode").value });
  if ($("log").checked) p.set("log", "1");
  if (Number($("smoothing").value)) p.set("smooth", $("smoothing").value);
  history.replaceState(null, "", "/compare?" + p.toString());
}

async function load() {
  C.diff = await GW.getJSON("/api/compare?ids=" + IDS.join(","));
  C.runs = C.diff.runs;
  const keyLists = await Promise.all(IDS.map((id) => GW.getJSON(`/api/runs/${id}/keys`)));
  const keys = [...new Set(keyLists.flat())].sort();
  $("key").replaceChildren(...keys.map((k) => GW.el("option", { value: k }, k)));
  $("key").value = keys.includes(params.get("key")) ? params.get("key") : keys.includes("loss") ? "loss" : keys[0] || "";
  $("x-mode").value = params.get("x") || "step";
  $("log").checked = params.get("log") === "1";
  $("smoothing").value = params.get("smooth") || "0";
  $("run-list").replaceChildren(...C.runs.map((r) => GW.el("span", {}, GW.el("span", { class: "swatch", style: "background:" + GW.colorFor(r.id) }), GW.el("a", { href: "/runs/" + r.id }, r.name), "  ")));
  renderDiff(); await draw();
}

async function draw() {
  const key = $("key").value; if (!key) return;
  $("chart-title").textContent = key;
  const entries = await Promise.all(C.runs.map(async (r) => {
    try {
      const s = await GW.getJSON(`/api/runs/${r.id}/series?key=${encodeURIComponent(key)}&max_points=4000`);
      const walls = s.wall_times, t0 = walls.length ? walls[0] : 0;
      return { label: r.name + " #" + r.id, color: GW.colorFor(r.id), series: { steps: s.steps, values: s.values.map(GW.num),
        walls: $("x-mode").value === "relative" ? walls.map((w) => w - t0) : walls } };
    } catch (e) { return null; }
  }));
  const mode = $("x-mode").value === "relative" ? "wall-relative" : $("x-mode").value;
  chart.xOf = (s, i, m) => (m === "step" ? s.steps[i] : m === "wall" ? new Date(s.walls[i] * 1000) : s.walls[i]);
  chart.render(entries.filter(Boolean), mode);
  syncUrl();
}

function renderDiff() {
  const only = $("only-diff").checked;
  const head = GW.el("tr", {}, GW.el("th", {}, "key"), ...C.runs.map((r) => GW.el("th", {}, GW.el("span", { class: "swatch", style: "background:" + GW.colorFor(r.id) }), r.name)));
  const rows = C.diff.rows.filter((row) => !only || row.differs).map((row) => GW.el("tr", { class: row.differs ? "differs" : "" },
    GW.el("td", {}, row.key), ...row.values.map((v) => GW.el("td", {}, v === null || v === undefined ? "—" : typeof v === "object" ? JSON.stringify(v) : String(v)))));
  $("diff").replaceChildren(head, ...rows);
}

for (const id of ["key", "x-mode", "log"]) $(id).addEventListener("change", draw);
$("smoothing").addEventListener("change", draw);
$("only-diff").addEventListener("change", renderDiff);
$("share").addEventListener("click", async () => {
  syncUrl();
  try { await navigator.clipboard.writeText(location.href); $("share").textContent = "Link copied"; } catch (e) { prompt("Share this link", location.href); }
});
if (IDS.length) load(); else $("chart-title").textContent = "Pick runs to compare on the runs list.";
