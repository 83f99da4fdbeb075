"""The notifier: a background thread that turns a new incident into notifications on the project's channels.

Ingest only puts the new alert on a bounded queue (``offer``, never blocks; a full queue drops and counts).
The thread waits ``grace`` seconds after a root (what the same steps bring joins its incident: the story
and the worst severity go out together), then reads the run and the incident: only the root of an incident pages (its consequences join the
incident, they do not page again), and not while the incident is acknowledged, snoozed or resolved. Each
channel whose ``min_severity`` the incident reaches gets it, retried with backoff; every delivery is
recorded (delivered / failed with the reason / limited) through the writer. At most ``per_run``
notifications per run per minute on each channel: the rest are recorded as limited. Besides a project's
channels every incident goes to the server's own: ``alert_email`` (critical ones) and ``--webhook`` (Slack text).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import NamedTuple

from sqlalchemy import select

from gradwatch import contract
from gradwatch_server.health import incidents
from gradwatch_server.notify import channels, egress, kinds
from gradwatch_server.storage import db, store

log = logging.getLogger("gradwatch.server")
RANK = {s: i for i, s in enumerate(contract.SEVERITIES)}
TEST_INTERVAL = 60.0  # seconds between two test notifications of one project
TEST_TIMEOUT = 5.0  # seconds a test waits on each channel (one try: a test shows what happens now)


class Context(NamedTuple):
    """What a channel kind may read of the server's settings when it sends."""

    smtp_url: str
    allow_hosts: frozenset
    timeout: float


class TooSoon(Exception):
    """A test notification of this project was sent less than TEST_INTERVAL ago; ``wait`` seconds remain."""

    def __init__(self, wait: float):
        super().__init__(f"one test notification a minute per project: try again in {wait:.0f} s")
        self.wait = wait


def server_webhook(url: str) -> list[dict]:
    """The ``webhook`` setting as channels (none when unset): Slack text, every severity, for every project."""
    return [{"kind": "webhook", "url": url, "format": "slack", "min_severity": "info", "server": True}] if url else []


def generic(exc: BaseException) -> str:
    """What the caller (and the deliveries list) is told of a failure: an HTTP status, or one generic line.

    A channel's URL is the caller's: the text a non-HTTP service answers, or "refused" against "timed out",
    would tell it what listens where. The detail goes to the server log."""
    text = str(exc)
    if isinstance(exc, OSError) and text.startswith("HTTP "):
        return text
    return "delivery failed: no valid answer from the receiver (details in the server log)"


class Notifier:
    """Delivers incidents to channels off the ingest path; see the module docstring."""

    def __init__(self, engine, writer, settings, retries: int = 3, backoff: float = 0.5, grace: float = 2.0):
        self.engine, self.writer = engine, writer
        self.smtp_url, self.base_url = settings.smtp_url, settings.base_url.rstrip("/")
        self.alert_email = [a.strip() for a in settings.alert_email.split(",") if a.strip()]
        self.webhook = server_webhook(settings.webhook)  # the server-wide webhook, for every project
        self.allow_hosts = egress.allowed_hosts(settings.notify_allow_hosts)  # what project channels may reach
        self.per_run, self.retries, self.backoff = settings.webhook_per_run, retries, backoff
        self.grace = grace  # seconds a root waits for what its step brought along (the story, the worst severity)
        self.queue: queue.Queue = queue.Queue(maxsize=1000)
        self.dropped = 0
        self.sent: dict[tuple, deque] = {}  # (run id, channel) -> times of its recent notifications
        self.tested: dict[str, float] = {}  # project -> when its last test notification went
        self.thread: threading.Thread | None = None

    def offer(self, run_id: int, alert: dict) -> None:
        """A new alert (from the event loop): queued for the thread, never waited on."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="gradwatch-notify", daemon=True)
            self.thread.start()
        try:
            self.queue.put_nowait((run_id, alert))
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join(timeout=5)

    def _loop(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                self._handle(*item)
            except Exception:  # a notification must never take the server down
                log.exception("gradwatch: notification failed")

    def _handle(self, run_id: int, alert: dict) -> None:
        wait = self.grace - (time.time() - (alert.get("created_at") or 0))
        if alert.get("incident_id") is not None and wait > 0:
            time.sleep(min(wait, self.grace))
        with self.engine.connect() as conn:
            note = self._note(conn, run_id, alert)
            if note is None:
                return
            chans = channels.load(conn, note["run"]["project"])
        for ch in self._targets(chans):
            if RANK[note["severity"]] < RANK[ch["min_severity"]]:
                continue
            if not self._allowed(run_id, channels.describe(ch)):
                self._record(note, ch, "limited", f"over {self.per_run} notifications per run per minute", 0)
                continue
            self._deliver(note, ch)

    def _targets(self, chans: list[dict]) -> list[dict]:
        extra = [{"kind": "email", "to": self.alert_email, "min_severity": "critical"}] if self.alert_email else []
        return chans + self.webhook + extra

    def _allowed(self, run_id: int, channel: str) -> bool:
        """Within the run's rate on this channel (one busy channel does not use up another's)."""
        now, sent = time.monotonic(), self.sent.setdefault((run_id, channel), deque())
        while sent and now - sent[0] > 60:
            sent.popleft()
        if len(sent) >= self.per_run:
            return False
        sent.append(now)
        return True

    def _note(self, conn, run_id: int, alert: dict) -> dict | None:
        """What to send for this alert, or None when it must not page (a consequence, a muted incident)."""
        run = conn.execute(select(db.runs.c.name, db.runs.c.project).where(db.runs.c.id == run_id)).first()
        if run is None:
            return None
        inc = None
        if alert.get("incident_id") is not None:
            row = conn.execute(select(db.incidents).where(db.incidents.c.id == alert["incident_id"])).first()
            if row is not None:
                if row.root_alert_id != alert.get("id"):
                    return None  # a consequence: the incident already paged
                joined = conn.execute(select(db.alerts).where(db.alerts.c.incident_id == row.id))
                inc = incidents.incident_dict(row, [store.alert_dict(a) for a in joined] or [alert])
                if inc["status"] != "open":
                    return None
        return {
            "run_id": run_id,
            "run": {"id": run_id, "name": run.name, "project": run.project},
            "alert": alert,
            "incident": inc,
            "severity": (inc or alert).get("severity") or "warning",
            "link": f"{self.base_url}/runs/{run_id}" if self.base_url else None,
        }

    def _send(self, note: dict, ch: dict) -> None:
        # the kind reads what it needs of the server's: smtp_url, allow_hosts, timeout
        kinds.of(ch).send(
            ch, note, Context(self.smtp_url, self.allow_hosts, TEST_TIMEOUT if note.get("test") else 10.0)
        )

    def _deliver(self, note: dict, ch: dict) -> dict:
        """Send with retries and backoff (a test: one try); record and return the outcome."""
        error, retries = None, 1 if note.get("test") else self.retries
        for attempt in range(1, retries + 1):
            try:
                self._send(note, ch)
                return self._record(note, ch, "delivered", None, attempt)
            except ValueError as exc:  # not worth retrying
                return self._record(note, ch, "failed", exc, attempt)
            except Exception as exc:
                error = generic(exc)
                log.warning("gradwatch: notification to %s failed: %r", channels.describe(ch), exc)
                if attempt < retries:
                    time.sleep(self.backoff * 2 ** (attempt - 1))
        return self._record(note, ch, "failed", error, retries)

    def _record(self, note: dict, ch: dict, status: str, reason, attempts: int) -> dict:
        inc = note.get("incident") or {}
        out = {
            "channel": channels.describe(ch),
            "status": status,
            "reason": reason and str(reason),
            "attempts": attempts,
        }
        self.writer.submit(
            channels.record,
            note["run"]["project"],
            note.get("run_id"),
            inc.get("id"),
            out["channel"],
            status,
            reason,
            attempts,
        )
        return out

    def test(self, project: str) -> list[dict]:
        """'Send a test notification': every channel of the project now, each outcome returned and recorded.

        At most one a minute per project (TooSoon with the seconds to wait)."""
        now = time.monotonic()
        last = self.tested.get(project)
        if last is not None and now - last < TEST_INTERVAL:
            raise TooSoon(TEST_INTERVAL - (now - last))
        self.tested[project] = now
        with self.engine.connect() as conn:
            chans = channels.load(conn, project)
        alert = {"kind": "test", "step": 0, "severity": "critical", "message": "A test notification from gradwatch."}
        note = {
            "run_id": None,
            "run": {"id": None, "name": "test", "project": project},
            "alert": alert,
            "incident": {"root": alert, "story": "a test notification", "cause": None},
            "severity": "critical",
            "link": self.base_url or None,
            "test": True,
        }
        out = [self._deliver(note, ch) for ch in self._targets(chans)]
        self.writer.submit(lambda conn: None).result(timeout=30)  # in submission order: the records are stored
        return out
