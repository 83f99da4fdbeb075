"""bench_abuse.py's cases for issue #30 (a team's server): each runs beside bench_abuse's Witness."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import quote

from bench_abuse import QUICK, Witness, batch, hello, ws_url  # noqa: F401 - the shared harness
from server_process import ServerProcess
from websockets.sync.client import connect

from gradwatch import protocol


def call(srv: ServerProcess, method: str, path: str, body=None, timeout: float = 120.0):
    """(status, answer, seconds) of one JSON request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, _json(resp.read()), time.perf_counter() - t0
    except urllib.error.HTTPError as err:
        return err.code, _json(err.read()), time.perf_counter() - t0


def _json(data: bytes):
    try:
        return json.loads(data or b"null")
    except ValueError:  # a page, not JSON
        return None


def stream_run(srv: ServerProcess, uid: str, project: str, steps: int, per: int = 2000):
    """A run of ``steps`` steps (loss and acc) in batches of ``per``; the open connection and the next seq."""
    ws = hello(srv.url, uid, project=project)
    seq = 0
    for lo in range(0, steps, per):
        seq += 1
        rows = [
            (s, time.time(), {"loss": 1.0 + (s % 7) * 0.01, "acc": 0.9}, {}) for s in range(lo, min(steps, lo + per))
        ]
        ws.send(batch(seq, rows))
        ws.recv(timeout=120)
    return ws, seq + 1


def costly_rules(n: int = 10) -> list:
    """The costliest custom rules a project's budget accepts: n_of_m over m=10,000 (10 of them: 100,000)."""
    return [
        {"name": f"r{i}", "key": "acc", "type": "n_of_m", "op": "<", "value": 0.5, "n": 3, "m": 10000} for i in range(n)
    ]


def costliest_proposal() -> list:
    """The costliest replay a project's budget accepts: 45 relative rules (window 1000) and 5 n_of_m (m=10,000)."""
    rel = {"key": "acc", "type": "relative", "op": "<", "factor": 0.5, "window": 1000}
    return [{**rel, "name": f"rel{i}"} for i in range(45)] + costly_rules(5)


def case_custom_rules(srv: ServerProcess) -> dict:
    status, body, _ = call(srv, "PUT", "/api/projects/rules-abuse/rules", {"custom": costly_rules()})
    assert status == 200, body
    over, _, _ = call(srv, "PUT", "/api/projects/rules-abuse/rules", {"custom": costly_rules(11)})
    witness = Witness(srv, "witness-6")
    conns = [stream_run(srv, f"rules-{i}", "rules-abuse", 1, per=1) for i in range(8)]
    t0, sent = time.perf_counter(), 0
    for round_ in range(5 if QUICK else 20):
        size = 1 if round_ % 2 == 0 else 2000
        for ws, _ in conns:  # 8 batches in flight at once
            rows = [(round_ * 2000 + i + 1, time.time(), {"acc": 0.9}, {}) for i in range(size)]
            ws.send(batch(round_ + 2, rows))
            sent += 1
        for ws, _ in conns:
            ws.recv(timeout=120)
    took = time.perf_counter() - t0
    for ws, _ in conns:
        ws.close()
    return {"rules": 10, "over_budget_status": over, "batches": sent, "abuse_s": round(took, 2), **witness.done()}


def case_replay(srv: ServerProcess) -> dict:
    steps = 2000 if QUICK else 10000
    for i in range(10):
        stream_run(srv, f"replay-{i}", "replay-abuse", steps)[0].close()
    witness = Witness(srv, "witness-7")
    status, out, took = call(srv, "POST", "/api/projects/replay-abuse/rules/backtest", {"custom": costliest_proposal()})
    assert status == 200, out
    return {
        "runs_x_steps": f"10 x {steps}",
        "rules": len(costliest_proposal()),
        "points": out["points"],
        "answer_s": round(took, 2),
        "complete": out["complete"],
        "stopped": out["stopped"],
        "runs_replayed": len(out["runs"]),
        **witness.done(),
    }


def tarpit() -> tuple[socket.socket, int]:
    """A listener that accepts and never answers (a slow receiver: what a hostile channel points to)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list = []
    threading.Thread(target=lambda: [held.append(sock.accept()) for _ in iter(int, 1)], daemon=True).start()
    return sock, sock.getsockname()[1]


def case_channel_tests(srv: ServerProcess) -> dict:
    sock, port = tarpit()
    n = 4 if QUICK else 6
    for i in range(n):
        chans = [{"kind": "webhook", "url": f"http://127.0.0.1:{port}/slow", "format": "json"}]
        assert call(srv, "PUT", f"/api/projects/tarpit-{i}/channels", {"channels": chans})[0] == 200
    run_ws, _ = stream_run(srv, "edited", "tarpit-0", 10)
    run_ws.close()
    run_id = next(r["id"] for r in call(srv, "GET", "/api/runs?project=tarpit-0")[1])
    witness = Witness(srv, "witness-8")
    tests = [
        threading.Thread(target=call, args=(srv, "POST", f"/api/projects/tarpit-{i}/channels/test")) for i in range(n)
    ]
    t0 = time.perf_counter()
    for t in tests:
        t.start()
    time.sleep(0.5)
    edit = call(srv, "PATCH", f"/api/runs/{run_id}", {"notes": "edited during the tarpit"})
    read = call(srv, "GET", "/api/runs")[2]  # the API's reads: not on the notifications' threads
    for t in tests:
        t.join()
    tests_s = time.perf_counter() - t0
    sock.close()
    return {
        "tests": n,
        "tests_s": round(tests_s, 2),
        "edit_s": round(edit[2], 2),
        "runs_read_s": round(read, 2),
        **witness.done(),
    }


def case_ssrf(srv: ServerProcess) -> dict:
    witness = Witness(srv, "witness-9")
    out = {}
    for name, url in (("metadata", "http://169.254.169.254/latest/meta-data/"), ("private", "http://10.0.0.1/x")):
        chans = [{"kind": "webhook", "url": url, "format": "json"}]
        call(srv, "PUT", f"/api/projects/ssrf-{name}/channels", {"channels": chans})
        status, body, took = call(srv, "POST", f"/api/projects/ssrf-{name}/channels/test")
        result = body["results"][0]  # the project channel (the server's own --webhook follows)
        out[name] = {
            "status": result["status"],
            "refused": "--notify-allow-hosts" in result["reason"],
            "s": round(took, 2),
        }
    return {**out, **witness.done()}


def case_mail_relay(srv: ServerProcess) -> dict:
    witness = Witness(srv, "witness-10")
    to = [f"user{i}@example.com" for i in range(50)]
    many = [{"kind": "email", "to": to} for _ in range(20)]  # 1,000 recipients offered
    put = call(srv, "PUT", "/api/projects/relay/channels", {"channels": many})[0]
    call(srv, "PUT", "/api/projects/relay/channels", {"channels": many[:1]})
    first = call(srv, "POST", "/api/projects/relay/channels/test")[0]
    second = call(srv, "POST", "/api/projects/relay/channels/test")[0]
    return {"put_1000_recipients": put, "first_test": first, "second_test_within_a_minute": second, **witness.done()}


def case_rebuild(srv: ServerProcess) -> dict:
    steps = 20000 if QUICK else 100000
    ws, seq = stream_run(srv, "long", "rebuild-abuse", steps, per=5000)
    witness = Witness(srv, "witness-11")
    put = call(srv, "PUT", "/api/projects/rebuild-abuse/rules", {"thresholds": {"loss_plateau.patience": 1e7}})
    t0 = time.perf_counter()
    ws.send(batch(seq, [(steps, time.time(), {"loss": 1.0}, {})]))
    ws.recv(timeout=120)
    next_batch = time.perf_counter() - t0
    ws.close()
    return {"steps": steps, "put_s": round(put[2], 2), "next_batch_s": round(next_batch, 2), **witness.done()}


def case_big_frames(srv: ServerProcess) -> dict:
    witness = Witness(srv, "witness-12")
    ws = connect(ws_url(srv.url, protocol.INGEST_PATH), max_size=None)
    t0 = time.perf_counter()
    big = {"uid": "big-hello", "project": "frames", "config": {"blob": "x" * (12 << 20)}}
    ws.send(json.dumps({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "run": big}))
    refused = json.loads(ws.recv(timeout=60))
    hello_s = time.perf_counter() - t0
    ws.close()
    frames = hello(srv.url, "big-frames", project="frames")
    t0, answers = time.perf_counter(), set()
    # ~1.5 MB frames over BIG_FRAME, parsed on the decodes' pool; sent out of sequence, so the writer only
    # answers "nack" (this case is about parsing off the event loop, not about committing big batches)
    for seq in range(1, (5 if QUICK else 20) + 1):
        rows = [(seq * 20000 + i, time.time(), {"loss": 1.0, "acc": 0.5, "lr": 0.1}, {}) for i in range(20000)]
        frames.send(batch(1000 + seq, rows))
        answers.add(json.loads(frames.recv(timeout=120))["type"])
    frames.close()
    return {
        "hello_mb": 12,
        "hello_answer": refused.get("type"),
        "hello_s": round(hello_s, 2),
        "big_frames_s": round(time.perf_counter() - t0, 2),
        "big_frame_answers": sorted(answers),
        **witness.done(),
    }


def case_queries(srv: ServerProcess) -> dict:
    witness = Witness(srv, "witness-13")
    deep = call(srv, "GET", "/api/runs?where=" + quote("(" * 400 + "config.lr < 1" + ")" * 400))[0]
    wide = call(srv, "GET", "/api/runs?where=" + quote(" or ".join(f"summary.k{i}.min < 1" for i in range(70))))[0]
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    sock.sendall(
        f"PUT /api/projects/p/rules HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Length: 100000\r\n\r\n{{".encode()
    )
    t0 = time.perf_counter()
    slow = sock.recv(100).decode().split(" ")[1]
    slow_s = time.perf_counter() - t0
    sock.close()
    return {
        "deep_status": deep,
        "wide_status": wide,
        "slow_body_status": int(slow),
        "slow_body_s": round(slow_s, 2),
        **witness.done(),
    }


CASES = {
    "custom_rules": case_custom_rules,
    "replay": case_replay,
    "channel_tests": case_channel_tests,
    "ssrf": case_ssrf,
    "mail_relay": case_mail_relay,
    "rebuild": case_rebuild,
    "big_frames": case_big_frames,
    "queries": case_queries,
}
