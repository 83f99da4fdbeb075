"""Generic JSON webhooks: the whole incident (headline, text, link, run, incident, alert) for a script to read."""

from __future__ import annotations

from gradwatch_server.notify import formats
from gradwatch_server.notify.kinds import webhook


def render(note: dict) -> dict:
    return {
        "type": "incident",
        "headline": formats.headline(note),
        "text": formats.text(note),
        "link": note.get("link"),
        "run": note.get("run"),
        "incident": note.get("incident"),
        "alert": note.get("alert"),
        "test": bool(note.get("test")),
    }


KIND = webhook.kind("json", "JSON webhook", render)
