"""Slack incoming webhooks: the notification's text, with Slack's markup escaped (a run named <!channel> never pings)."""

from __future__ import annotations

from gradwatch_server.notify import formats
from gradwatch_server.notify.kinds import webhook


def escape(text) -> str:
    """Text that Slack shows as written: its three control characters as entities (its own rule)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(note: dict) -> dict:
    return {"text": escape(formats.text(note))}  # docs/security.md


KIND = webhook.kind("slack", "Slack webhook", render)
