// The runs list's banner: the runs in view that need a look, one line each, the worst first (critical
// before warning, then newest), at most MAX_SHOWN with "+k more" pointing at the inbox.
import { SEVERITIES } from "../../lib/contract.js";
import { el } from "../../lib/dom.js";

export const MAX_SHOWN = 3;
const DAY = 86400;
const CHAR_PX = 7.2; // an average character of the banner's 14 px font: how much text one line holds

export const severityRank = (s) => SEVERITIES.indexOf(s); // -1 for none; critical highest

// ``text`` cut to at most ``max`` characters at a word boundary, with "…" when it was cut.
export function clip(text, max) {
  if (text.length <= max) return text;
  const cut = text.slice(0, Math.max(0, max - 1));
  const space = cut.lastIndexOf(" ");
  return (space > max / 2 ? cut.slice(0, space) : cut).replace(/[\s,.;:·→-]+$/, "") + "…";
}

// What a run that needs a look shows: its worst open incident (from the inbox) if it has one, else its
// newest alert, else why it stopped. Null for a run that needs none.
function entry(r, incident, now) {
  const a = r.last_alert;
  const recent = a && (r.status === "running" || a.created_at > now - DAY);
  const died = (r.status === "failed" || r.status === "crashed") && r.updated_at > now - DAY;
  if (!incident && !recent && !died) return null;
  if (incident) {
    const root = incident.root || { kind: incident.kind, message: "" };
    const what = (incident.story || root.kind).split(" → ")[0];
    const why = incident.cause ? "cause: " + incident.cause : root.message;
    return { r, severity: incident.severity, kind: root.kind, what, why, at: incident.updated_at || 0 };
  }
  if (recent) {
    const where = "step " + (a.step ?? "?") + (a.layer ? " · " + a.layer : "");
    return { r, severity: a.severity, kind: a.kind, what: a.kind + " at " + where, why: a.message, at: a.created_at };
  }
  const why = "the training process " + (r.status === "failed" ? "raised an exception" : "stopped reporting");
  return { r, severity: "critical", kind: r.status, what: r.status, why, at: r.updated_at };
}

// The banner's lines for ``runs`` (the rows in view) and the open incidents (the inbox's, worst first).
export function attentionLines(runs, incidents, width, inboxHref) {
  const worst = new Map();
  for (const inc of incidents) if (inc.status === "open" && !worst.has(inc.run_id)) worst.set(inc.run_id, inc);
  const now = Date.now() / 1000;
  const entries = runs
    .map((r) => entry(r, worst.get(r.id), now))
    .filter(Boolean)
    .sort((x, y) => severityRank(y.severity) - severityRank(x.severity) || y.at - x.at);
  const room = Math.max(40, Math.floor(width / CHAR_PX));
  const lines = entries.slice(0, MAX_SHOWN).map((e) => {
    const used = e.r.name.length + e.what.length + 6;
    return el(
      "div",
      {
        class: "alert banner-line " + (e.severity || "warning"),
        "data-run": e.r.id,
        "data-kind": e.kind,
        "data-severity": e.severity || "",
        title: `${e.r.name} · ${e.what} · ${e.why}`,
      },
      el("b", {}, e.what),
      el("a", { href: "/runs/" + e.r.id }, e.r.name),
      el("span", { class: "muted" }, " · " + clip(e.why || "", room - used)),
    );
  });
  const more = entries.length - lines.length;
  if (more > 0)
    lines.push(
      el(
        "a",
        { class: "banner-more", href: inboxHref },
        more > 1 ? `+${more} more runs need a look` : "+1 more run needs a look",
      ),
    );
  return lines;
}
