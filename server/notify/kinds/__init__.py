"""Every notification channel kind, one module each, registered here (one line per kind).

A kind (``ChannelKind``) is how one sort of channel is checked, rendered and sent, and the option schema the
rules page builds its form from (served with ``GET /api/projects/{p}/channels``). Adding a kind: a module
beside these with its ``KIND``, and its line in ``KINDS``.
"""

from __future__ import annotations

from gradwatch_server.notify.kinds import discord, emails, json_post, slack
from gradwatch_server.notify.kinds.base import ChannelKind

KINDS: tuple[ChannelKind, ...] = (
    slack.KIND,
    discord.KIND,
    json_post.KIND,
    emails.KIND,
)


def get(name: str) -> ChannelKind:
    """The kind called ``name`` (KeyError for none)."""
    return {k.name: k for k in KINDS}[name]


def of(ch: dict) -> ChannelKind:
    """The kind of a stored (or submitted) channel: the one whose ``stored`` fields it carries."""
    if ch.get("kind") == "webhook" and "format" not in ch:
        ch = {**ch, "format": "json"}  # a webhook submitted without a format posts JSON
    for kind in KINDS:
        if all(ch.get(k) == v for k, v in kind.stored.items()):
            return kind
    raise ValueError(f"must be one of the channel kinds {', '.join(k.name for k in KINDS)}")


def schema() -> list[dict]:
    """What the channel form is built from: every kind's name, label, stored fields and options."""
    return [k.schema() for k in KINDS]
