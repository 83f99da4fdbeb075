"""Alert delivery to a webhook: a background thread with retries, never blocking ingest."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.request

log = logging.getLogger("gradwatch.webhook")


def payload(alert: dict, run: dict | None, base_url: str = "") -> dict:
    """The JSON body: the alert's fields, the run, and a Slack-compatible ``text``."""
    name = (run or {}).get("name", f"run {alert.get('run_id')}")
    link = f" {base_url}/runs/{alert.get('run_id')}" if base_url else ""
    text = (
        f"[gradwatch] {alert['severity'].upper()} {alert['kind']} in {name} at step {alert.get('step')}: "
        f"{alert['message']}{link}"
    )
    return {"text": text, "alert": alert, "run": run}


class WebhookSender:
    """Posts queued payloads; retries with backoff (up to ``attempts``), drops only after that."""

    def __init__(self, url: str, attempts: int = 5, timeout: float = 5.0):
        self.url, self.attempts, self.timeout = url, attempts, timeout
        self._queue: queue.Queue = queue.Queue(10000)
        self.delivered = 0
        self.failed = 0
        threading.Thread(target=self._loop, name="gradwatch-webhook", daemon=True).start()

    def send(self, body: dict) -> None:
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self.failed += 1
            log.warning("webhook queue full; alert not posted: %s", body.get("text"))

    def _loop(self) -> None:
        while True:
            body = self._queue.get()
            data = json.dumps(body).encode()
            for attempt in range(self.attempts):
                try:
                    req = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                        if resp.status < 300:
                            self.delivered += 1
                            break
                except Exception as exc:
                    log.warning("webhook post failed (attempt %d): %s", attempt + 1, exc)
                time.sleep(min(0.5 * 2**attempt, 10))
            else:
                self.failed += 1
