// The alerts inbox: every incident across runs (open first), its root cause and story, its run, and the
// buttons to acknowledge, snooze, mute or resolve it. Refreshed every few seconds while open.
import { statusButtons } from "../lib/alerts.js";
import { $, el } from "../lib/dom.js";
import { getJSON } from "../lib/fetch.js";

function card(inc) {
  const root = inc.root || { kind: inc.kind, message: "" };
  return el(
    "div",
    {
      class: "alert incident " + inc.severity,
      "data-incident": inc.id,
      "data-status": inc.status,
      "data-run": inc.run_id,
    },
    el("b", {}, root.kind),
    el("a", { href: "/runs/" + inc.run_id }, inc.run_name),
    el(
      "span",
      { class: "muted" },
      " · " + inc.project + (inc.first_step !== null ? " · from step " + inc.first_step : ""),
    ),
    el("span", { class: "status incident-status" }, inc.status),
    ...statusButtons(inc, load),
    el("div", { class: "incident-story" }, inc.story),
    inc.cause ? el("div", { class: "incident-cause" }, "Cause: " + inc.cause) : null,
    el("div", { class: "muted alert-first" }, root.message),
  );
}

async function load() {
  const q = new URLSearchParams();
  if ($("f-status").value) q.set("status", $("f-status").value);
  if ($("f-project").value.trim()) q.set("project", $("f-project").value.trim());
  let found;
  try {
    found = await getJSON("/api/incidents?" + q);
  } catch (e) {
    $("inbox").replaceChildren(el("div", { class: "alert critical" }, "Could not load the inbox: " + e.message));
    return;
  }
  $("inbox").replaceChildren(...found.map(card));
  $("empty").hidden = found.length > 0;
  const open = found.filter((i) => i.status === "open").length;
  $("count").textContent = `${found.length} incidents, ${open} open`;
}

$("f-status").addEventListener("change", load);
$("f-project").addEventListener("change", load);
load();
setInterval(() => document.hidden || load(), 5000);
