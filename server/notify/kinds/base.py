"""What a notification channel kind is: its stored identity, its options (the form), check, render, send, describe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    """One field of a channel's form: ``type`` is ``url`` (one http(s) URL) or ``emails`` (a comma-separated list)."""

    name: str
    label: str
    type: str
    secret: bool = False  # a webhook URL is the secret that posts to its channel

    def schema(self) -> dict:
        return {"name": self.name, "label": self.label, "type": self.type, "secret": self.secret}


@dataclass(frozen=True)
class ChannelKind:
    """One kind of channel.

    Args:
        name: what the form offers and docs name (``slack``).
        label: the form's wording (``Slack webhook``).
        stored: the fields that mark a stored channel as this kind (``{"kind": "webhook", "format": "slack"}``).
        options: the fields a user fills in.
        check: ``(where, channel) -> {option: value}`` normalised, or ValueError naming ``where``.
        send: ``(channel, note, context) -> None``; raises on failure (ValueError: not worth retrying).
        describe: ``channel -> str``, how deliveries name it (without secrets).
    """

    name: str
    label: str
    stored: dict
    options: tuple[Option, ...]
    check: Callable[[str, dict], dict]
    send: Callable
    describe: Callable[[dict], str]

    def schema(self) -> dict:
        return {
            "name": self.name,
            "label": self.label,
            "stored": self.stored,
            "options": [o.schema() for o in self.options],
        }
