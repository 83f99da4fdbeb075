"""Alert delivery to a webhook: a background thread with retries, never blocking ingest.

Each run has its own small queue and rate (``per_run`` posts a minute), and the thread takes the
runs in turn, so one run raising thousands of alerts cannot delay another run's. What a run has
over its rate is counted and said in its next post. Names and messages are escaped for Slack's
markup (``<!channel>``, ``<url|text>`` links), so a run name cannot ping a channel or disguise a link.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections import deque

log = logging.getLogger("gradwatch.webhook")
PER_RUN = 10  # default posts per run per minute (the webhook_per_run setting)
RUN_BACKLOG = 20  # posts one run may have waiting
WINDOW = 60.0


def slack_escape(text) -> str:
    """Text that Slack shows as written: its three control characters as entities (its own rule)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def payload(alert: dict, run: dict | None, base_url: str = "") -> dict:
    """The JSON body: the alert's fields, the run, and a Slack-compatible ``text``."""
    name = (run or {}).get("name", f"run {alert.get('run_id')}")
    link = f" {base_url}/runs/{alert.get('run_id')}" if base_url else ""
    text = (
        f"[gradwatch] {slack_escape(str(alert['severity']).upper())} {slack_escape(alert['kind'])} in "
        f"{slack_escape(name)} at step {alert.get('step')}: {slack_escape(alert['message'])}{link}"
    )
    return {"text": text, "alert": alert, "run": run}


class WebhookSender:
    """Posts queued payloads, runs in turn; retries with backoff (up to ``attempts``), drops only after that."""

    def __init__(self, url: str, attempts: int = 5, timeout: float = 5.0, per_run: int = PER_RUN):
        self.url, self.attempts, self.timeout, self.per_run = url, attempts, timeout, per_run
        self._runs: dict = {}  # run id -> deque of bodies waiting
        self._turns: deque = deque()  # run ids with something waiting, in turn order
        self._sent: dict = {}  # run id -> times of its recent accepted posts
        self.suppressed: dict = {}  # run id -> alerts over its rate not posted yet (said in its next post)
        self._ready = threading.Condition()
        self.delivered = 0
        self.failed = 0
        threading.Thread(target=self._loop, name="gradwatch-webhook", daemon=True).start()

    def accepts(self, run_id) -> bool:
        """Whether a post for ``run_id`` would be queued now (within its rate and backlog)."""
        with self._ready:
            return self._accepts(run_id, time.monotonic())

    def _accepts(self, run_id, now: float) -> bool:
        sent = self._sent.setdefault(run_id, deque())
        while sent and now - sent[0] > WINDOW:
            sent.popleft()
        return len(sent) < self.per_run and len(self._runs.get(run_id, ())) < RUN_BACKLOG

    def send(self, body: dict | None, run_id=None) -> None:
        """Queue ``body`` for ``run_id``'s turn, or count it as suppressed (None: only count one)."""
        with self._ready:
            now = time.monotonic()
            if body is None or not self._accepts(run_id, now):
                self.suppressed[run_id] = self.suppressed.get(run_id, 0) + 1
                return
            skipped = self.suppressed.pop(run_id, 0)
            if skipped:
                body = {
                    **body,
                    "text": f"{body['text']} (and {skipped} earlier alerts of this run not posted: "
                    f"webhook limit of {self.per_run} a minute per run)",
                    "suppressed": skipped,
                }
            self._sent[run_id].append(now)
            if run_id not in self._runs:
                self._runs[run_id] = deque()
                self._turns.append(run_id)
            self._runs[run_id].append(body)
            self._ready.notify()

    def _next(self) -> dict:
        """The next body, one run at a time in turn."""
        with self._ready:
            while not self._turns:
                self._ready.wait()
            run_id = self._turns.popleft()
            waiting = self._runs[run_id]
            body = waiting.popleft()
            if waiting:
                self._turns.append(run_id)
            else:
                del self._runs[run_id]
            return body

    def _loop(self) -> None:
        while True:
            self._post(json.dumps(self._next()).encode())

    def _post(self, data: bytes) -> None:
        for attempt in range(self.attempts):
            try:
                req = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    if resp.status < 300:
                        self.delivered += 1
                        return
            except Exception as exc:
                log.warning("webhook post failed (attempt %d): %s", attempt + 1, exc)
            time.sleep(min(0.5 * 2**attempt, 10))
        self.failed += 1
