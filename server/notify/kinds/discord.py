"""Discord webhooks: the notification's text within Discord's limit, its markdown escaped (a run named
``[click](https://evil)`` shows as written, not as a masked link), with no @everyone/@here/role pings."""

from __future__ import annotations

import re

from gradwatch_server.notify import formats
from gradwatch_server.notify.kinds import webhook

MARKDOWN = re.compile(r"([\\`*_~|>#\[\]()<:-])")


def escape(text) -> str:
    """Text Discord shows as written: every markdown character backslash-escaped."""
    return MARKDOWN.sub(r"\\\1", str(text))


def render(note: dict) -> dict:
    body = escape(formats.text({**note, "link": None}))
    if note.get("link"):
        body = f"{body[: 1990 - len(note['link'])]}\n{note['link']}"  # the link stays a link
    return {"content": body[:2000], "allowed_mentions": {"parse": []}}


KIND = webhook.kind("discord", "Discord webhook", render)
