"""The server-wide ``--webhook`` against a real HTTP receiver: one Slack-text notification per incident, with its
story, retried, recorded in the deliveries, rate-limited per run; and alerts are visible fast."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from conftest import Api
from test_incidents import spirals_run
from waiting import wait_until

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
        wait_until(lambda: len(self.bodies) >= n, timeout=timeout, interval=0.05, message=f"{n} posts")
        return self.bodies


def _deliveries(api: Api, project: str, n: int, timeout: float = 20.0) -> list:
    return wait_until(
        lambda: len(got := api.get(f"/api/projects/{project}/deliveries")) >= n and got,
        timeout=timeout,
        interval=0.1,
        message=f"{n} deliveries",
    )


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
        assert set(body) == {"text"}  # the Slack format, like a project's slack channel
        assert body["text"].startswith("gradwatch [critical]: nan_loss in nan-run (hooks)") and "step 6" in body["text"]
        assert received_at - bad_step_time < 10  # the incident's grace, then two failed attempts with backoff
        (delivery,) = _deliveries(Api(srv.url), "hooks", 1)  # recorded like every notification
        assert delivery["status"] == "delivered" and delivery["attempts"] == 3
        assert delivery["channel"] == f"slack {receiver.url}" and delivery["run_id"] == 1
    finally:
        srv.stop()
        receiver.httpd.shutdown()


def test_one_incident_is_one_post_with_its_story(settings):
    receiver = Receiver()
    srv = BackgroundServer(dataclasses.replace(settings, webhook=receiver.url)).start()
    try:
        api = Api(srv.url)
        spirals_run(gradwatch.init(project="story", name="lr3", server=srv.url), 3.0)
        assert len(api.get("/api/runs/1/alerts")) > 1  # several alerts ...
        _deliveries(api, "story", 1)
        time.sleep(1.5)  # a consequence paging again would show by now
        ((_, body),) = receiver.bodies  # ... one post: the incident's
        assert "→" in body["text"] and "Cause: learning rate" in body["text"]
        assert len(api.get("/api/projects/story/deliveries")) == 1
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


# --- issue #18: Slack markup escaped; one run's flood cannot starve another's alerts -----------


def test_slack_markup_in_names_and_messages_is_escaped():
    from gradwatch_server.notify.kinds import slack

    alert = {"run_id": 3, "severity": "warning", "kind": "loss_spike", "step": 5, "message": "<!here> & <http://x|y>"}
    note = {"run_id": 3, "run": {"name": "<!channel> <https://evil.example|click me>", "project": "p"}, "alert": alert}
    text = slack.render(note)["text"]
    assert "<!" not in text and "<http" not in text and "|click me>" not in text
    assert "&lt;!channel&gt; &lt;https://evil.example|click me&gt;" in text and "&amp;" in text


def test_webhook_posts_are_rate_limited_per_run(settings):
    """One run's flood is limited (and recorded as such); another run's alert still goes out."""
    from gradwatch_server.ingest.hello import open_run
    from gradwatch_server.ingest.writer import Writer
    from gradwatch_server.notify import channels
    from gradwatch_server.notify.dispatcher import Notifier
    from gradwatch_server.storage import database

    receiver = Receiver()
    engine = database.make_engine(settings.db_url)
    with engine.begin() as conn:
        for uid in ("a", "b"):
            open_run(conn, {"uid": uid, "project": "flood", "name": uid}, {})
    writer = Writer(engine)
    notifier = Notifier(engine, writer, dataclasses.replace(settings, webhook=receiver.url, webhook_per_run=5))
    try:
        for i in range(30):  # run 1 floods
            notifier.offer(1, {"kind": "loss_spike", "step": i, "severity": "warning", "message": f"flood {i}"})
        notifier.offer(2, {"kind": "nan_loss", "step": 1, "severity": "critical", "message": "quiet run's alert"})
        bodies = [b["text"] for _, b in receiver.wait(6, timeout=20)]
        assert any("quiet run's alert" in t for t in bodies)

        def all_recorded():
            with engine.connect() as conn:
                return len(got := channels.deliveries(conn, "flood")) >= 31 and got

        got = wait_until(all_recorded, timeout=20, interval=0.1, message="31 deliveries recorded")
        status = [(d["run_id"], d["status"]) for d in got]
        assert status.count((1, "delivered")) == 5 and status.count((1, "limited")) == 25
        assert status.count((2, "delivered")) == 1 and len(receiver.bodies) == 6
    finally:
        notifier.close()
        writer.close()
        engine.dispose()
        receiver.httpd.shutdown()
