"""The server-wide ``--webhook``: one more notification channel (Slack text) for every project, and Slack's escaping.

It goes through ``notify/`` like a project's channels: one notification per incident with its story, rate-limited
per run, retried, recorded in the deliveries. Names and messages are escaped for Slack's markup (``<!channel>``,
``<url|text>`` links), so a run name cannot ping a channel or disguise a link.
"""

from __future__ import annotations


def slack_escape(text) -> str:
    """Text that Slack shows as written: its three control characters as entities (its own rule)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def channel(url: str) -> list[dict]:
    """The ``webhook`` setting as channels (none when unset): Slack text, every severity."""
    return [{"kind": "webhook", "url": url, "format": "slack", "min_severity": "info"}] if url else []
