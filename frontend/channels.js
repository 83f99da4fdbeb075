// The notification channels of one project (on the rules page): webhooks (Slack, Discord, JSON) and emails,
// each with its minimum severity; a test button; the deliveries with their status and reason.
import { el, getJSON } from "./common.js";

const $ = (id) => document.getElementById(id);
const PROJECT = new URLSearchParams(location.search).get("project") || "default";
const API = `/api/projects/${encodeURIComponent(PROJECT)}`;

const select = (options, value, field) => {
  const s = el("select", { "data-field": field }, ...options.map((o) => el("option", { value: o }, o)));
  s.value = value;
  return s;
};

function row(ch = { kind: "webhook", format: "slack", min_severity: "warning" }) {
  const tr = el(
    "tr",
    { class: "channel" },
    el("td", {}, select(["webhook", "email"], ch.kind, "kind")),
    el("td", {}, el("input", { "data-field": "target", size: 50, value: ch.url || (ch.to || []).join(", ") })),
    el("td", {}, select(["slack", "discord", "json"], ch.format || "json", "format")),
    el("td", {}, select(["info", "warning", "critical"], ch.min_severity || "warning", "min_severity")),
    el("td", {}, el("button", { onclick: () => tr.remove() }, "Remove")),
  );
  return tr;
}

function edited() {
  return [...document.querySelectorAll("#channels .channel")].map((tr) => {
    const f = (name) => tr.querySelector(`[data-field='${name}']`).value.trim();
    return f("kind") === "webhook"
      ? { kind: "webhook", url: f("target"), format: f("format"), min_severity: f("min_severity") }
      : { kind: "email", to: f("target"), min_severity: f("min_severity") };
  });
}

async function deliveries() {
  const list = await getJSON(API + "/deliveries");
  $("deliveries").tBodies[0].replaceChildren(
    ...list.map((d) =>
      el(
        "tr",
        { class: "delivery", "data-status": d.status },
        el("td", {}, new Date(d.at * 1000).toLocaleString()),
        el("td", {}, d.channel),
        el("td", {}, d.status),
        el("td", {}, String(d.attempts)),
        el("td", {}, d.reason || ""),
      ),
    ),
  );
}

async function call(fn, done) {
  try {
    await fn();
    $("channel-message").textContent = done;
  } catch (e) {
    $("channel-message").textContent = "Failed: " + e.message;
  }
  deliveries();
}

$("add-channel").addEventListener("click", () => $("channels").tBodies[0].append(row()));
$("save-channels").addEventListener("click", () =>
  call(
    () =>
      getJSON(API + "/channels", {
        method: "PUT",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ channels: edited() }),
      }),
    "channels saved",
  ),
);
$("test-channels").addEventListener("click", () =>
  call(() => getJSON(API + "/channels/test", { method: "POST" }), "test sent: see the deliveries below"),
);
getJSON(API + "/channels").then((c) => $("channels").tBodies[0].replaceChildren(...c.channels.map(row)));
deliveries();
