// A run's alerts, grouped by kind: first step, last step, how many, the first message always in view.
import { el } from "./common.js";

// A repeating problem is one alert with count/last_step (older servers: one alert per occurrence),
// and a push with an id already held is an update of that alert, not a new one.
export function upsert(alerts, alert) {
  const i = alerts.findIndex((a) => a.id === alert.id);
  if (i >= 0) {
    alerts[i] = alert;
    return false;
  }
  alerts.push(alert);
  return true;
}

const countOf = (a) => (Number.isFinite(a.count) && a.count >= 1 ? a.count : 1);
const lastOf = (a) => (a.last_step !== undefined && a.last_step !== null ? a.last_step : a.step);

// Groups in order of each kind's first alert: the first problem is usually the cause of the rest
// (exploding gradients before the NaN), so it leads and never scrolls away behind newer ones.
export function group(alerts) {
  const by = new Map();
  for (const a of alerts) {
    if (!by.has(a.kind))
      by.set(a.kind, { kind: a.kind, alerts: [], count: 0, first: null, last: null, severity: "warning" });
    const g = by.get(a.kind);
    g.alerts.push(a);
    g.count += countOf(a);
    if (a.step !== null && a.step !== undefined && (g.first === null || a.step < g.first)) g.first = a.step;
    const last = lastOf(a);
    if (last !== null && last !== undefined && (g.last === null || last > g.last)) g.last = last;
    if (a.severity === "critical") g.severity = "critical";
  }
  return [...by.values()];
}

function steps(g) {
  if (g.first === null) return "";
  return g.last !== null && g.last !== g.first ? `steps ${g.first}–${g.last}` : `step ${g.first}`;
}

// One card per kind: kind, count, step span, the first alert's message (what started it) and,
// when there were more, the latest one's; a button zooms every chart to the first step.
export function renderAlerts(container, alerts, zoomTo) {
  const cards = group(alerts).map((g) => {
    const first = g.alerts[0],
      latest = g.alerts[g.alerts.length - 1];
    const where = (a) => (a.layer ? " · " + a.layer : "");
    return el(
      "div",
      { class: "alert " + g.severity, "data-kind": g.kind, "data-count": g.count },
      el("b", {}, g.kind),
      el("span", { class: "alert-count", title: "times raised" }, g.count + "×"),
      el("span", { class: "muted alert-steps" }, steps(g) + where(first) + " · "),
      el("span", { class: "alert-first" }, first.message),
      g.first === null
        ? null
        : el(
            "button",
            { class: "zoom-to", title: "zoom every chart to this step", onclick: () => zoomTo(g.first) },
            "Show step " + g.first,
          ),
      latest !== first
        ? el(
            "div",
            { class: "muted alert-latest" },
            "latest: step " + (lastOf(latest) ?? "?") + where(latest) + " · " + latest.message,
          )
        : null,
    );
  });
  container.replaceChildren(...cards);
}

export function notify(alert, runName) {
  if (!document.hidden || !("Notification" in window) || Notification.permission !== "granted") return;
  new Notification("gradwatch: " + alert.kind + " in " + runName, { body: alert.message });
}
