// The notification channels of one project (on the rules page), each with its minimum severity; a test button;
// the deliveries with their status and reason. The form is built from the channel kinds the server serves
// (GET .../channels: `kinds`, each with its stored fields and options), so a new kind needs nothing here.
import { SEVERITIES } from "../../lib/contract.js";
import { $, el } from "../../lib/dom.js";
import { getJSON } from "../../lib/fetch.js";

const PROJECT = new URLSearchParams(location.search).get("project") || "default";
const API = `/api/projects/${encodeURIComponent(PROJECT)}`;
let KINDS = [];

const select = (options, value, field) => {
  const s = el("select", { "data-field": field }, ...options.map(([v, label]) => el("option", { value: v }, label)));
  s.value = value;
  return s;
};

// The kind whose stored fields a channel carries (a webhook without a format posts JSON).
const kindOf = (ch) =>
  KINDS.find((k) =>
    Object.entries(k.stored).every(
      ([f, v]) => (f === "format" && ch.kind === "webhook" ? ch.format || "json" : ch[f]) === v,
    ),
  ) || KINDS[0];

function optionInputs(kind, ch) {
  return kind.options.map((o) => {
    const value = Array.isArray(ch[o.name]) ? ch[o.name].join(", ") : ch[o.name] || "";
    return el("input", { "data-option": o.name, placeholder: o.label, title: o.label, size: 50, value });
  });
}

function row(ch = {}) {
  const kind = ch.kind ? kindOf(ch) : KINDS[0];
  const options = el("td", { class: "options" }, ...optionInputs(kind, ch));
  const kinds = select(
    KINDS.map((k) => [k.name, k.label]),
    kind.name,
    "channel-kind",
  );
  kinds.addEventListener("change", () =>
    options.replaceChildren(
      ...optionInputs(
        KINDS.find((k) => k.name === kinds.value),
        {},
      ),
    ),
  );
  const tr = el(
    "tr",
    { class: "channel" },
    el("td", {}, kinds),
    options,
    el(
      "td",
      {},
      select(
        SEVERITIES.map((s) => [s, s]),
        ch.min_severity || "warning",
        "min_severity",
      ),
    ),
    el("td", {}, el("button", { onclick: () => tr.remove(), "data-needs": "admin" }, "Remove")),
  );
  return tr;
}

function edited() {
  return [...document.querySelectorAll("#channels .channel")].map((tr) => {
    const kind = KINDS.find((k) => k.name === tr.querySelector("[data-field='channel-kind']").value);
    const out = { ...kind.stored, min_severity: tr.querySelector("[data-field='min_severity']").value };
    for (const input of tr.querySelectorAll("[data-option]")) out[input.dataset.option] = input.value.trim();
    return out;
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
getJSON(API + "/channels").then((c) => {
  KINDS = c.kinds;
  $("channels").tBodies[0].replaceChildren(...c.channels.map(row));
});
deliveries();
