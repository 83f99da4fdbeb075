"""Alerts reach a webhook receiver started by the test, with retries; and they arrive fast."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import gradwatch
from gradwatch_server.serve import BackgroundServer


class Receiver:
    """An HTTP server that fails the first ``fail_first`` posts, then records bodies."""

    def __init__(self, fail_first: int = 0):
        self.bodies: list = []
        self.fail_left = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.fail_left > 0:
                    outer.fail_left -= 1
                    self.send_response(503)
                else:
                    outer.bodies.append((time.time(), body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout: float = 20.0) -> list:
        deadline = time.time() + timeout
        while len(self.bodies) < n and time.time() < deadline:
            time.sleep(0.05)
        return self.bodies


def test_alert_is_posted_with_slack_text_after_retries(settings):
    receiver = Receiver(fail_first=2)
    srv = BackgroundServer(dataclasses.replace(settings, webhook=receiver.url)).start()
    try:
        run = gradwatch.init(project="hooks", name="nan-run", server=srv.url, flush_interval=0.05)
        for i in range(10):
            run.log({"loss": 1.0 if i != 6 else float("nan")})
        bad_step_time = time.time()
        run.finish()
        ((received_at, body),) = receiver.wait(1)
        assert body["alert"]["kind"] == "nan_loss" and body["alert"]["step"] == 6
        assert "nan_loss" in body["text"] and "nan-run" in body["text"]
        assert received_at - bad_step_time < 10  # includes two failed attempts with backoff
    finally:
        srv.stop()
        receiver.httpd.shutdown()


def test_bad_step_to_alert_latency_is_sub_second(server, api):
    run = gradwatch.init(project="hooks", name="latency", server=server.url, flush_interval=0.1)
    for _i in range(20):
        run.log({"loss": 1.0})
    time.sleep(0.3)
    t0 = time.time()
    run.log({"loss": float("inf")})
    while not api.get("/api/runs/1/alerts") and time.time() - t0 < 10:
        time.sleep(0.01)
    latency = time.time() - t0
    run.finish()
    assert api.get("/api/runs/1/alerts")[0]["kind"] == "nan_loss"
    print(f"bad step -> alert visible over HTTP: {latency * 1000:.0f} ms")
    assert latency < 1.0
