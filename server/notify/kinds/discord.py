"""Discord webhooks: the notification's text within Discord's limit, with no @everyone/@here/role pings."""

from __future__ import annotations

from gradwatch_server.notify import formats
from gradwatch_server.notify.kinds import webhook


def render(note: dict) -> dict:
    return {"content": formats.text(note)[:2000], "allowed_mentions": {"parse": []}}


KIND = webhook.kind("discord", "Discord webhook", render)
