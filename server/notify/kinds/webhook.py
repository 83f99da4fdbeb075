"""What the webhook kinds share: the URL option, its check, the JSON POST and a name without the URL's query."""

from __future__ import annotations

import urllib.parse

from gradwatch_server.notify import egress
from gradwatch_server.notify.kinds.base import ChannelKind, Option

URL = Option("url", "Webhook URL", "url", secret=True)


def check(where: str, ch: dict) -> dict:
    url = ch.get("url")
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https") or len(url) > 2000:
        raise ValueError(f"{where}.url must be an http(s) URL")
    return {"url": url}


def send(ch: dict, body: dict, context) -> None:
    """POST ``body`` to the channel's URL: to allowed addresses only (egress.py), but the server's own webhook."""
    egress.post(ch["url"], body, egress.ANY if ch.get("server") else context.allow_hosts, context.timeout)


def describe(ch: dict) -> str:
    """``slack https://hooks.slack.com/services``: the query, where secrets live, left out."""
    parts = urllib.parse.urlsplit(ch["url"])
    return f"{ch['format']} {parts.scheme}://{parts.netloc}{parts.path}"[:400]


def kind(name: str, label: str, render) -> ChannelKind:
    """A webhook kind that posts ``render(note)`` as JSON to its URL."""
    return ChannelKind(
        name=name,
        label=label,
        stored={"kind": "webhook", "format": name},
        options=(URL,),
        check=check,
        send=lambda ch, note, context: send(ch, render(note), context),
        describe=describe,
    )
