"""Email to a list of addresses, through the server's ``smtp_url``: the headline as subject, the text as body."""

from __future__ import annotations

import re

from gradwatch_server.notify import formats, mail
from gradwatch_server.notify.kinds.base import ChannelKind, Option

ADDRESS = re.compile(r"^[^@\s,]+@[^@\s,]+$")
MAX_RECIPIENTS = 50


def check(where: str, ch: dict) -> dict:
    to = ch.get("to")
    if isinstance(to, str):
        to = [t.strip() for t in to.split(",") if t.strip()]
    if not isinstance(to, list) or not to or not all(isinstance(t, str) and ADDRESS.match(t) for t in to):
        raise ValueError(f"{where}.to must be one or more email addresses")
    return {"to": to[:MAX_RECIPIENTS]}


def send(ch: dict, note: dict, context) -> None:
    if not context.smtp_url:
        raise ValueError("no smtp_url set on the server")
    mail.send(context.smtp_url, ch["to"], formats.headline(note), formats.text(note), timeout=context.timeout)


KIND = ChannelKind(
    name="email",
    label="Email",
    stored={"kind": "email"},
    options=(Option("to", "Email addresses (comma-separated)", "emails"),),
    check=check,
    send=send,
    describe=lambda ch: ("email " + ", ".join(ch["to"]))[:400],
)
