// The run page's incident bar: one line at the top (what happened, where, why, its severity and how
// many alerts), expanding to every incident's story, cause, buttons and alert cards (lib/alerts.js).
import { headline } from "../../lib/alerts.js";
import { el } from "../../lib/dom.js";
import { plural } from "../../lib/format.js";

// Fills the bar's summary line from the run's alerts; the bar stays hidden while there are none.
export function renderIncidentLine(bar, line, alerts) {
  const h = headline(alerts);
  bar.hidden = !h;
  if (!h) return;
  bar.classList.toggle("critical", h.severity === "critical");
  bar.dataset.severity = h.severity;
  const counts = [h.incidents > 1 ? plural(h.incidents, "incident") : null, plural(h.alerts, "alert")];
  line.replaceChildren(
    el("span", { class: "severity " + h.severity }, h.severity),
    el("b", { class: "incident-title", title: h.kind }, h.title),
    h.step !== null ? el("span", { class: "incident-where" }, " at step " + h.step) : null,
    h.why ? el("span", { class: "incident-why", title: h.why }, " — " + h.why) : null,
    el("span", { class: "muted incident-counts" }, counts.filter(Boolean).join(" · ")),
  );
}
