// The rules editor of one project (/rules?project=p): built-in rules on/off, severities, thresholds, custom
// rules on any metric; "Replay" shows where the edited rules would fire on recent runs next to where the
// current ones did, and only then can the edit be saved (PUT; who saved it comes from the token). The
// replay runs by itself on load and shortly after each edit: a preview of what the rules would catch.
// Each rule and threshold is explained by its spec in the contract (title, doc, unit, meaning).
import { CUSTOM_RULE_OPS, RULE_SPECS, SEVERITIES, CUSTOM_RULE_TYPES as TYPES } from "../lib/contract.js";
import { $, el } from "../lib/dom.js";
import { getJSON } from "../lib/fetch.js";
import { fmtNumber, kindTitle } from "../lib/format.js";

const PROJECT = new URLSearchParams(location.search).get("project") || "default";
const API = `/api/projects/${encodeURIComponent(PROJECT)}/rules`;
let loaded = null;
let replayedFor = null; // the JSON of the document the shown replay is for
let savedDoc = null; // the JSON of the document as stored: nothing to save while the edit equals it

const select = (options, value, attrs = {}) => {
  const s = el("select", attrs, ...options.map((o) => el("option", { value: o }, o || "default")));
  s.value = value ?? "";
  return s;
};

function builtinRow(kind, doc, defaults) {
  const names = Object.keys(defaults).filter((n) => n.startsWith(kind + "."));
  const on = el("input", { type: "checkbox", "data-kind": kind, class: "rule-on", "aria-label": kind + " on" });
  on.checked = !doc.disabled.includes(kind);
  return el(
    "tr",
    { "data-kind": kind },
    el("td", {}, on),
    el(
      "td",
      { class: "rule-name" },
      el("b", { title: kind }, kindTitle(kind)),
      RULE_SPECS[kind]?.doc ? el("div", { class: "muted rule-doc" }, RULE_SPECS[kind].doc) : null,
    ),
    el(
      "td",
      {},
      select(["", ...SEVERITIES], doc.severity[kind], { class: "rule-severity", "aria-label": kind + " severity" }),
    ),
    el(
      "td",
      {},
      ...names.map((n) => {
        const spec = RULE_SPECS[kind]?.settings?.[n] || {};
        return el(
          "label",
          { class: "threshold", title: n + rangeOf(spec) },
          el("span", { class: "threshold-name" }, n.slice(kind.length + 1)),
          el("input", {
            "data-name": n,
            class: "rule-threshold",
            size: 6,
            placeholder: String(defaults[n]),
            value: doc.thresholds[n] ?? "",
          }),
          el("span", { class: "threshold-unit" }, spec.unit || ""),
          el("span", { class: "muted threshold-doc" }, spec.doc || ""),
        );
      }),
    ),
  );
}

function customRow(r = {}) {
  const input = (field, size = 8) =>
    el("input", {
      "data-field": field,
      size,
      value: r[field] ?? "",
      "aria-label": field,
    });
  const main = r.type === "relative" ? r.factor : r.type === "zscore" ? r.z : r.value;
  const tr = el(
    "tr",
    { class: "custom-rule" },
    el("td", {}, input("name", 14)),
    el("td", {}, input("key", 14)),
    el("td", {}, select(TYPES, r.type || TYPES[0], { "data-field": "type" })),
    el("td", {}, select(CUSTOM_RULE_OPS, r.op || CUSTOM_RULE_OPS[0], { "data-field": "op" })),
    el("td", {}, el("input", { "data-field": "main", size: 8, value: main ?? "", "aria-label": "value" })),
    el("td", {}, input("n", 3)),
    el("td", {}, input("m", 3)),
    el("td", {}, input("window", 4)),
    el("td", {}, input("cooldown", 4)),
    el("td", {}, select(SEVERITIES, r.severity || "warning", { "data-field": "severity" })),
    el(
      "td",
      {},
      el(
        "button",
        {
          onclick: () => {
            tr.remove();
            changed();
            schedulePreview();
          },
        },
        "Remove",
      ),
    ),
  );
  return tr;
}

// A threshold's allowed range, for its hover text (from the spec).
function rangeOf(spec) {
  if (spec.min === undefined) return "";
  const low = (spec.inclusive ? "≥ " : "> ") + fmtNumber(spec.min);
  return ` (${low}${spec.max !== null && spec.max !== undefined ? ", ≤ " + fmtNumber(spec.max) : ""}${spec.integer ? ", whole steps" : ""})`;
}

// The document as edited (numbers as numbers; blank means default).
function edited() {
  const doc = { disabled: [], thresholds: {}, severity: {}, custom: [] };
  for (const box of document.querySelectorAll(".rule-on")) if (!box.checked) doc.disabled.push(box.dataset.kind);
  for (const s of document.querySelectorAll(".rule-severity"))
    if (s.value) doc.severity[s.closest("tr").dataset.kind] = s.value;
  for (const i of document.querySelectorAll(".rule-threshold"))
    if (i.value.trim() !== "") doc.thresholds[i.dataset.name] = Number(i.value);
  for (const tr of document.querySelectorAll(".custom-rule")) {
    const f = (name) => tr.querySelector(`[data-field='${name}']`).value.trim();
    const r = { name: f("name"), key: f("key"), type: f("type"), op: f("op"), severity: f("severity") };
    const main = Number(f("main"));
    if (r.type === "relative") r.factor = main;
    else if (r.type === "zscore") r.z = main;
    else r.value = main;
    for (const n of ["n", "m", "window", "cooldown"]) if (f(n) !== "") r[n] = Number(f(n));
    doc.custom.push(r);
  }
  return doc;
}

function changed() {
  const now = JSON.stringify(edited());
  $("save").disabled = replayedFor !== now || now === savedDoc;
  $("save").title = now === savedDoc ? "nothing changed" : $("save").disabled ? "replay first" : "save these rules";
}

// After an edit, the preview replays by itself once the typing stops.
let previewTimer = null;
function schedulePreview() {
  clearTimeout(previewTimer);
  previewTimer = setTimeout(() => {
    if (replayedFor !== JSON.stringify(edited())) replay();
  }, 1500);
}

const brief = (list) =>
  list.length
    ? list.map((a) => `${a.kind === "custom_rule" ? a.layer : kindTitle(a.kind)} @ ${a.step}`).join(", ")
    : "nothing";

async function replay() {
  const doc = edited();
  $("message").textContent = "replaying…";
  try {
    const out = await getJSON(API + "/backtest", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(doc),
    });
    $("replay-result").replaceChildren(
      el(
        "table",
        { id: "replay-table" },
        el(
          "thead",
          {},
          el("tr", {}, el("th", {}, "run"), el("th", {}, "current rules fired"), el("th", {}, "proposed would fire")),
        ),
        el(
          "tbody",
          {},
          ...out.runs.map((r) =>
            el(
              "tr",
              { "data-run": r.run_id },
              el("td", {}, el("a", { href: "/runs/" + r.run_id }, r.name)),
              el("td", { class: "current" }, brief(r.current)),
              el("td", { class: "proposed" }, brief(r.proposed)),
            ),
          ),
        ),
      ),
    );
    replayedFor = JSON.stringify(doc);
    $("message").textContent = `replayed on ${out.runs.length} runs in ${out.seconds} s`;
  } catch (e) {
    $("message").textContent = "Cannot replay: " + e.message;
    replayedFor = null;
  }
  changed();
}

async function save() {
  try {
    const body = edited(); // who saved it is the server's to say (the token's identity), not a typed name
    render(
      await getJSON(API, {
        method: "PUT",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      }),
    );
    $("message").textContent = "saved: running runs apply them from their next batch";
  } catch (e) {
    $("message").textContent = "Not saved: " + e.message;
  }
}

function render(doc) {
  loaded = { ...loaded, ...doc };
  $("builtin").tBodies[0].replaceChildren(...loaded.kinds.map((k) => builtinRow(k, doc, loaded.defaults)));
  $("custom").tBodies[0].replaceChildren(...doc.custom.map(customRow));
  $("history").replaceChildren(
    ...doc.history.map((h) =>
      el("li", {}, `${new Date(h.at * 1000).toLocaleString()} · ${h.by || "someone"}: ${h.changes.join("; ")}`),
    ),
  );
  replayedFor = null;
  savedDoc = JSON.stringify(edited());
  changed();
}

$("project").textContent = PROJECT;
$("add-custom").addEventListener("click", () => {
  $("custom").tBodies[0].append(customRow());
  changed();
});
$("replay").addEventListener("click", replay);
$("save").addEventListener("click", save);
for (const type of ["input", "change"])
  document.querySelector("main").addEventListener(type, (ev) => {
    changed();
    if (ev.target.closest("#builtin, #custom")) schedulePreview();
  });
getJSON(API).then((doc) => {
  loaded = doc;
  render(doc);
  replay(); // what the rules as they are caught on the recent runs
});
