// Configs as pages show them: key/value rows, a nested config as a collapsible tree, flat dotted keys.
import { el } from "./dom.js";

// Key/value rows; empty values (no git repository, no notes) are left out rather than shown as "null".
export function kv(dl, obj) {
  const rows = Object.entries(obj).filter(([, v]) => v !== null && v !== undefined && v !== "");
  dl.replaceChildren(
    ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))]),
  );
}
// The config as a tree: a nested section (HF's args, model) is a collapsed <details> with its own
// rows, small lists inline; every value is text (a config is the user's data).
export function configTree(obj) {
  const dl = el("dl", { class: "kv tree" });
  for (const [k, v] of Object.entries(obj)) {
    const nested = v !== null && typeof v === "object" && !(Array.isArray(v) && v.every((x) => typeof x !== "object"));
    if (nested) {
      const n = Object.keys(v).length;
      dl.append(
        el("dt", {}, k),
        el(
          "dd",
          {},
          el(
            "details",
            { "data-key": k },
            el("summary", { class: "muted" }, `${n} ${n === 1 ? "entry" : "entries"}`),
            configTree(v),
          ),
        ),
      );
    } else dl.append(el("dt", {}, k), el("dd", {}, Array.isArray(v) ? v.join(", ") : v === null ? "-" : String(v)));
  }
  return dl;
}

// A nested config as flat dotted keys ({optim: {lr: 1}} -> {"optim.lr": 1}); lists are values.
export function flatten(value, prefix = "", out = {}) {
  if (value && typeof value === "object" && !Array.isArray(value))
    for (const [k, v] of Object.entries(value)) flatten(v, prefix ? `${prefix}.${k}` : k, out);
  else if (prefix) out[prefix] = value;
  return out;
}
