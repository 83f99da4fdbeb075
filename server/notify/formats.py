"""What a notification says (every channel kind renders these): one incident, its root cause first, a link to the run."""

from __future__ import annotations


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
