"""What one abusive client costs everyone else (issue #18), against a real `gradwatch serve` process.

Run: .venv/bin/python benchmarks/bench_abuse.py [--quick] [--json OUT]

Each case runs a bad client and, meanwhile, a well-behaved run that sends a one-point batch every
50 ms; it reports the good run's worst ack latency, the worst /healthz latency, and the server's
resident memory (from /proc) before and at its peak.

1. config x alerts: a hello with a config near the cap, then batches that each raise an alert,
   with one runs-list page that never reads, one that reads (bytes it received), and a webhook.
2. a page that never reads while a run streams points (the page's budget bounds its queue).
3. a chunked POST to the open /login route, 200 MiB offered.
4. slowloris: many connections that never finish their headers.
5. a heatmap read of a very wide vector (20,000 layers x 400 steps; --quick: 2,000 x 100).

Issue #30's findings, each beside the witness (a run in another project) and the /healthz probe:

6. custom rules: a project with the costliest rules its budget accepts (10 n_of_m over m=10,000), fed
   one-record and 2,000-record batches from 8 connections.
7. replay: the costliest accepted proposal (10 n_of_m m=10,000) over 10 runs x 10k steps (--quick: 10 x 2k):
   it answers (complete, or stopped at its budget or deadline) within 10 s.
8. channel tests against a tarpit (accepts, never answers), 6 projects at once (--quick: 4), while a run
   edit and a login are timed (they have their own pools).
9. SSRF: channels to the metadata address, a private one and this machine's loopback listener (the bench
   server allows 127.0.0.1 for its tarpit, so the listener case uses a second loopback name): refused.
10. mail relay: a test notification to 2,500 recipients: refused at PUT (50 a project), then 1 a minute.
11. rebuild depth: patience 1e7 on a 100k-step run (--quick: 20k), then its next batch.
12. a 12 MB hello (refused before it is parsed) and 5 MB batch frames (parsed off the event loop).
13. the runs language 400 deep and 70 summary keys wide (400s), and a trickling request body (408).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import urllib.request
import warnings
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from server_process import ServerProcess, rss_mib  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from gradwatch import protocol  # noqa: E402

QUICK = "--quick" in sys.argv
warnings.filterwarnings("ignore", category=DeprecationWarning)  # websockets' sync connect() outside `with`


def ws_url(url: str, path: str) -> str:
    return "ws" + url[len("http") :] + path


def hello(url: str, uid: str, project: str = "abuse", **run):
    ws = connect(ws_url(url, protocol.INGEST_PATH), max_size=None)
    body = {"uid": uid, "project": project, "name": uid, "secret": "s-" + uid, **run}
    ws.send(json.dumps({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "run": body}))
    reply = json.loads(ws.recv(timeout=30))
    assert reply["type"] == "welcome", reply
    return ws


def batch(seq: int, records: list, **extra) -> str:
    return protocol.dumps({"type": "batch", "seq": seq, "columns": protocol.encode_columns(records), **extra})


class Witness:
    """The well-behaved run and a /healthz prober, timing every answer while a case runs."""

    def __init__(self, srv: ServerProcess, uid: str):
        self.srv, self.ws = srv, hello(srv.url, uid, project="witness")  # another project than the abuse
        self.acks: list[float] = []
        self.health: list[float] = []
        self.peak = rss_mib(srv.pid)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        seq = 0
        while not self.stop.is_set():
            seq += 1
            t0 = time.perf_counter()
            self.ws.send(batch(seq, [(seq, time.time(), {"loss": 1.0}, {})]))
            self.ws.recv(timeout=120)
            self.acks.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            urllib.request.urlopen(self.srv.url + "/healthz", timeout=120).read()
            self.health.append(time.perf_counter() - t0)
            self.peak = max(self.peak, rss_mib(self.srv.pid))
            time.sleep(0.05)

    def done(self) -> dict:
        self.stop.set()
        self.thread.join()
        self.ws.close()
        return {
            "good_ack_max_ms": round(max(self.acks, default=0) * 1000, 1),
            "good_ack_p99_ms": round(p99(self.acks) * 1000, 1),
            "healthz_max_ms": round(max(self.health, default=0) * 1000, 1),
            "healthz_p99_ms": round(p99(self.health) * 1000, 1),
            "rss_peak_mb": round(self.peak, 1),
        }


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def sink() -> tuple[HTTPServer, list]:
    """A webhook receiver that takes 50 ms per post."""
    got: list = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(0.05)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, got


def case_config_alerts(srv: ServerProcess, batches: int) -> dict:
    lazy = connect(ws_url(srv.url, "/ws/runs"), max_size=None)  # never read
    reader = connect(ws_url(srv.url, "/ws/runs"), max_size=None)
    received = [0]

    def read():
        try:
            while True:
                received[0] += len(reader.recv(timeout=30))
        except Exception:
            pass

    threading.Thread(target=read, daemon=True).start()
    before = rss_mib(srv.pid)
    witness = Witness(srv, "witness-1")
    bad = hello(srv.url, "bad-config", config={"blob": "y" * (1000 << 10)})
    t0 = time.perf_counter()
    for seq in range(1, batches + 1):
        ev = [{"type": "alert", "kind": "data_gap", "key": f"k{seq}", "severity": "warning", "message": "<!channel>"}]
        bad.send(batch(seq, [(seq, time.time(), {"loss": 1.0}, {})], events=ev))
        bad.recv(timeout=120)
    acks_s = time.perf_counter() - t0
    bad.close()
    time.sleep(0.5)
    out = {"rss_before_mb": round(before, 1), "bad_acks_s": round(acks_s, 2), **witness.done()}
    out["reading_page_received_kb"] = round(received[0] / 1024, 1)
    lazy.close()
    reader.close()
    return out


def case_lazy_page(srv: ServerProcess, batches: int) -> dict:
    writer = hello(srv.url, "streamer")
    run_id = json.loads(urllib.request.urlopen(srv.url + "/api/runs", timeout=30).read())[0]["id"]
    lazy = connect(ws_url(srv.url, f"/ws/runs/{run_id}"), max_size=None)  # never read
    before = rss_mib(srv.pid)
    witness = Witness(srv, "witness-2")
    layers = [f"l{i}" for i in range(500)]
    for seq in range(1, batches + 1):
        rows = [(seq * 50 + i, time.time(), {"loss": 1.0}, {"grad": [0.5] * len(layers)}) for i in range(50)]
        writer.send(batch(seq, rows, layouts={"grad": layers}))
        writer.recv(timeout=120)
    writer.close()
    out = {"rss_before_mb": round(before, 1), **witness.done()}
    lazy.close()
    return out


def case_chunked(srv: ServerProcess, mib: int) -> dict:
    before = rss_mib(srv.pid)
    witness = Witness(srv, "witness-3")
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    sock.sendall(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk, sent = b"a" * (1 << 20), 0
    try:
        for _ in range(mib):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += 1
    except OSError:
        pass
    sock.close()
    return {"rss_before_mb": round(before, 1), "mib_accepted_before_cut": sent, **witness.done()}


def case_slowloris(srv: ServerProcess, n: int) -> dict:
    before = rss_mib(srv.pid)
    witness = Witness(srv, "witness-4")
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        socks.append(s)
    time.sleep(2.5)  # past the 2 s header timeout this benchmark serves with
    closed = 0
    for s in socks:
        s.settimeout(2)
        try:
            closed += s.recv(1) == b""
        except OSError:
            closed += 1
        s.close()
    return {"rss_before_mb": round(before, 1), "half_sent": n, "closed_by_server": closed, **witness.done()}


def case_heatmap(srv: ServerProcess, layers: int, steps: int) -> dict:
    names = [f"layer{i}" for i in range(layers)]
    ws = hello(srv.url, f"wide-{layers}")
    per = max(1, (8 << 20) // (layers * 11))  # frames under the 16 MiB default
    for seq, lo in enumerate(range(0, steps, per), start=1):
        rows = [
            (s, time.time(), {}, {"grad": [float(i % 13) for i in range(layers)]})
            for s in range(lo, min(steps, lo + per))
        ]
        ws.send(batch(seq, rows, layouts={"grad": names}))
        ws.recv(timeout=120)
    ws.close()
    runs = json.loads(urllib.request.urlopen(srv.url + "/api/runs", timeout=30).read())
    run_id = next(r["id"] for r in runs if r["name"] == f"wide-{layers}")
    before = rss_mib(srv.pid)
    witness = Witness(srv, "witness-5")
    t0 = time.perf_counter()
    body = urllib.request.urlopen(f"{srv.url}/api/runs/{run_id}/heatmap?key=grad&max_steps=400", timeout=120).read()
    took = time.perf_counter() - t0
    heat = json.loads(body)
    return {
        "layers": layers,
        "steps": steps,
        "columns": len(heat["steps"]),
        "request_s": round(took, 2),
        "response_mb": round(len(body) / 2**20, 1),
        "rss_before_mb": round(before, 1),
        **witness.done(),
    }


def main() -> dict:
    import tempfile

    httpd, posts = sink()
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(
            f"sqlite:///{tmp}/abuse.db",
            "--webhook",
            f"http://127.0.0.1:{httpd.server_port}/hook",
            "--header-timeout",
            "2",
            "--max-connections-per-client",
            "1000",
            "--notify-allow-hosts",
            "127.0.0.1",  # the tarpit channel's receiver (case 8); metadata and private addresses stay refused
        )
        try:
            results = {
                "config_x_alerts": case_config_alerts(srv, 30 if QUICK else 200),
                "lazy_page": case_lazy_page(srv, 20 if QUICK else 200),
                "chunked_login": case_chunked(srv, 50 if QUICK else 400),
                "slowloris": case_slowloris(srv, 50 if QUICK else 200),
                "heatmap": case_heatmap(srv, 2000 if QUICK else 20000, 100 if QUICK else 400),
            }
            results["webhook_posts"] = len(posts)
            from abuse_team import CASES  # issue #30's cases, on the same server

            for name, case in CASES.items():
                results[name] = case(srv)
        finally:
            srv.stop()
            httpd.shutdown()
    return results


if __name__ == "__main__":
    out = main()
    print(json.dumps(out, indent=1))
    if "--json" in sys.argv:
        Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps(out))
