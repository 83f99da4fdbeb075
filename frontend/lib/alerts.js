// A run's alerts as incidents (one problem: its root cause, then the consequences in step order), each
// grouped by kind inside: first step, last step, how many, the first message always in view.
import { el } from "./dom.js";
import { getJSON } from "./fetch.js";
import { kindTitle, kindWords, plural } from "./format.js";

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
function kindCards(alerts, zoomTo) {
  return group(alerts).map((g) => {
    const first = g.alerts[0],
      latest = g.alerts[g.alerts.length - 1];
    const where = (a) => (a.layer ? " · " + a.layer : "");
    return el(
      "div",
      { class: "alert " + g.severity, "data-kind": g.kind, "data-count": g.count },
      el("b", { title: g.kind }, kindTitle(g.kind)),
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
}

// What the server says about each incident (status, cause, story), by id; fetched per run when an
// incident id appears that the page has not seen, then the last render is redone.
const INCIDENTS = new Map();
const loading = new Set();
let lastRender = null;

async function loadIncidents(runId, force = false) {
  if (loading.has(runId) && !force) return;
  loading.add(runId);
  try {
    for (const inc of await getJSON(`/api/runs/${runId}/incidents`)) INCIDENTS.set(inc.id, inc);
  } catch {
    /* the cards still show every alert; status and cause come with the next render */
  } finally {
    loading.delete(runId);
  }
  if (lastRender) renderAlerts(...lastRender);
}

export async function setStatus(incidentId, body) {
  const inc = await getJSON(`/api/incidents/${incidentId}/status`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  INCIDENTS.set(inc.id, inc);
  if (lastRender) renderAlerts(...lastRender);
  return inc;
}

export function statusButtons(inc, after) {
  const act = (label, body, title) =>
    el(
      "button",
      {
        class: "incident-" + body.status,
        title,
        "data-needs": "edit",
        onclick: () => setStatus(inc.id, body).then(after),
      },
      label,
    );
  if (inc.id === null || inc.id < 0) return [];
  return inc.status === "open"
    ? [
        act("Acknowledge", { status: "acknowledged" }, "someone is on it"),
        act("Snooze 1 h", { status: "snoozed", minutes: 60 }, "no notifications for an hour"),
        act("Mute", { status: "snoozed", minutes: null }, "no notifications until reopened"),
        act("Resolve", { status: "resolved" }, "fixed; a recurrence reopens it"),
      ]
    : [act("Reopen", { status: "open" }, "back to open")];
}

// Alerts of one incident (the server's incident_id), incidents in order of their first alert.
export function incidents(alerts) {
  const by = new Map();
  for (const a of alerts) {
    const id = a.incident_id ?? null;
    if (!by.has(id)) by.set(id, []);
    by.get(id).push(a);
  }
  return [...by.entries()].map(([id, list]) => ({ id, alerts: list }));
}

// One card per incident: its root (the cause, with what the server found: the LR, a layer), the story in
// step order, its status with buttons, and the per-kind cards of its alerts (expandable). Alerts from
// before incidents (no incident_id) keep the per-kind cards.
export function renderAlerts(container, alerts, zoomTo, after) {
  lastRender = [container, alerts, zoomTo, after];
  const cards = [];
  for (const inc of incidents(alerts)) {
    if (inc.id === null) {
      cards.push(...kindCards(inc.alerts, zoomTo));
      continue;
    }
    const known = INCIDENTS.get(inc.id);
    if (!known || known.alerts.length !== inc.alerts.length) loadIncidents(inc.alerts[0].run_id);
    const ordered = [...inc.alerts].sort((a, b) => (a.step ?? Infinity) - (b.step ?? Infinity) || a.id - b.id);
    const root = known?.root ?? ordered[0];
    const status = known?.status ?? "open";
    const severity = ordered.some((a) => a.severity === "critical") ? "critical" : "warning";
    const body = el("details", { class: "incident-alerts" }, el("summary", {}, plural(ordered.length, "alert")));
    body.open = status === "open";
    body.append(...kindCards(ordered, zoomTo));
    cards.push(
      el(
        "div",
        { class: "incident " + severity, "data-incident": inc.id, "data-status": status, "data-root": root.kind },
        el(
          "div",
          { class: "incident-head" },
          el("b", { title: root.kind }, kindTitle(root.kind)),
          el(
            "span",
            { class: "muted" },
            root.step !== null && root.step !== undefined ? " from step " + root.step : "",
          ),
          el("span", { class: "status incident-status" }, status),
          ...(known ? statusButtons(known, () => {}) : []),
        ),
        known?.story ? el("div", { class: "incident-story" }, kindWords(known.story)) : null,
        known?.cause ? el("div", { class: "incident-cause" }, "Cause: " + known.cause) : null,
        body,
      ),
    );
  }
  const runId = alerts.find((a) => a.incident_id !== null && a.incident_id !== undefined)?.run_id;
  container.replaceChildren(...(runId !== undefined ? [runButtons(runId)] : []), ...cards);
  if (after) after();
}

const RANK = { critical: 0, warning: 1, info: 2 };
const hasStep = (a) => a.step !== null && a.step !== undefined;
const byStep = (a, b) => (a.step ?? Infinity) - (b.step ?? Infinity) || a.id - b.id;

// A run's problems in one line: the lead incident (open before handled, critical before warning, then
// the earliest), what happened in it (its first critical alert, else its root), where and why.
// Returns null without alerts; else {title, kind, step, severity, why, incidents, alerts}.
export function headline(alerts) {
  if (!alerts.length) return null;
  const list = incidents(alerts).map((inc) => {
    const known = inc.id === null ? null : INCIDENTS.get(inc.id);
    const ordered = [...inc.alerts].sort(byStep);
    const severity = ordered.some((a) => a.severity === "critical") ? "critical" : ordered[0].severity || "warning";
    return { known, ordered, severity, open: (known?.status ?? "open") === "open" };
  });
  list.sort(
    (a, b) =>
      b.open - a.open ||
      (RANK[a.severity] ?? 3) - (RANK[b.severity] ?? 3) ||
      (a.ordered[0].step ?? Infinity) - (b.ordered[0].step ?? Infinity),
  );
  const lead = list[0];
  const what = lead.ordered.find((a) => a.severity === "critical") || lead.known?.root || lead.ordered[0];
  const why = lead.known?.cause || firstSentence(lead.known?.root?.message || lead.ordered[0].message);
  return {
    title: kindTitle(what.kind),
    kind: what.kind,
    step: hasStep(what) ? what.step : null,
    severity: lead.severity,
    why,
    incidents: list.filter((i) => i.known || i.ordered.length).length,
    alerts: alerts.length,
  };
}

const firstSentence = (text) => String(text || "").split(/(?<=\.)\s/)[0];

// The steps worth a marker on the charts: per incident (or per kind, for alerts without one), the
// first alert of each kind, as {step, kind, message}; the repeats stay in the cards.
export function keySteps(alerts) {
  const seen = new Set(),
    out = [];
  for (const a of [...alerts].filter(hasStep).sort(byStep)) {
    const id = `${a.incident_id ?? "-"}/${a.kind}`;
    if (seen.has(id)) continue;
    seen.add(id);
    out.push({ step: a.step, kind: a.kind, message: a.message, severity: a.severity });
  }
  return out;
}

// Per run: every incident at once (acknowledge them all, or mute the run until someone reopens).
function runButtons(runId) {
  const act = (label, body, title) =>
    el(
      "button",
      {
        class: "run-" + body.status,
        title,
        "data-needs": "edit",
        onclick: async () => {
          await getJSON(`/api/runs/${runId}/incidents/status`, {
            method: "POST",
            headers: { "Content-Type": "application/json" },
            body: JSON.stringify(body),
          });
          await loadIncidents(runId, true);
        },
      },
      label,
    );
  return el(
    "div",
    { class: "incident-run-actions muted" },
    "All incidents of this run: ",
    act("Acknowledge all", { status: "acknowledged" }, "acknowledge every incident of this run"),
    act("Mute run", { status: "snoozed", minutes: null }, "no notifications from this run until reopened"),
  );
}

export function notify(alert, runName) {
  if (!document.hidden || !("Notification" in window) || Notification.permission !== "granted") return;
  new Notification("gradwatch: " + alert.kind + " in " + runName, { body: alert.message });
}
