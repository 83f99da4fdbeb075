"""Email over SMTP: ``smtp://user:pass@host:587`` (STARTTLS when the server offers it) or ``smtps://host:465``."""

from __future__ import annotations

import re
import smtplib
import ssl
import urllib.parse
from email.message import EmailMessage

CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def check_url(url: str) -> urllib.parse.SplitResult:
    """The parsed URL, or ValueError saying what is wrong."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise ValueError("smtp_url must look like smtp://user:pass@host:587 or smtps://host:465")
    return parts


def send(url: str, to: list[str], subject: str, body: str, sender: str = "", timeout: float = 10.0) -> None:
    """Send one mail; raises OSError / smtplib.SMTPException on failure (the caller retries)."""
    parts = check_url(url)
    port = parts.port or (465 if parts.scheme == "smtps" else 587)
    msg = EmailMessage()
    msg["From"] = sender or f"gradwatch@{parts.hostname}"
    msg["To"] = ", ".join(to)
    msg["Subject"] = CONTROL.sub(" ", subject)[:200]  # a run named "a\r\nBcc: x" still mails, on one line
    msg.set_content(body)
    context = ssl.create_default_context()
    if parts.scheme == "smtps":
        client = smtplib.SMTP_SSL(parts.hostname, port, timeout=timeout, context=context)
    else:
        client = smtplib.SMTP(parts.hostname, port, timeout=timeout)
    with client:
        if parts.scheme == "smtp":
            client.ehlo()
            if client.has_extn("starttls"):
                client.starttls(context=context)
                client.ehlo()
        if parts.username:
            client.login(urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or ""))
        client.send_message(msg)
