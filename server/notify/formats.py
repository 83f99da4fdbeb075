"""What a notification says, per channel format: one incident, its root cause first, with a link to the run."""

from __future__ import annotations

from gradwatch_server.live.webhook import slack_escape

FORMATS = ("slack", "discord", "json")


def headline(note: dict) -> str:
    """'gradwatch: loss_divergence in lr-too-high (proj): diverged at 1 → loss NaN at 4'."""
    inc, run = note.get("incident") or {}, note.get("run") or {}
    root = inc.get("root") or note.get("alert") or {}
    where = f"{run.get('name', 'run ' + str(note.get('run_id')))} ({run.get('project', '?')})"
    story = inc.get("story") or f"{root.get('kind')} at step {root.get('step')}"
    severity = note.get("severity") or root.get("severity", "warning")
    return f"gradwatch [{severity}]: {root.get('kind')} in {where}: {story}"


def text(note: dict) -> str:
    """The plain-text body: headline, cause, the root's message, the link."""
    inc, root = note.get("incident") or {}, (note.get("incident") or {}).get("root") or note.get("alert") or {}
    lines = [headline(note)]
    if inc.get("cause"):
        lines.append(f"Cause: {inc['cause']}")
    if root.get("message"):
        lines.append(root["message"])
    if note.get("link"):
        lines.append(note["link"])
    return "\n".join(lines)


def render(fmt: str, note: dict) -> dict:
    """The JSON body of a webhook post in ``fmt``."""
    if fmt == "slack":
        return {"text": slack_escape(text(note))}  # a run named <!channel> must not ping (docs/security.md)
    if fmt == "discord":
        # Discord's limit per message; no @everyone/@here/role pings from a run's name or message
        return {"content": text(note)[:2000], "allowed_mentions": {"parse": []}}
    return {
        "type": "incident",
        "headline": headline(note),
        "text": text(note),
        "link": note.get("link"),
        "run": note.get("run"),
        "incident": note.get("incident"),
        "alert": note.get("alert"),
        "test": bool(note.get("test")),
    }
