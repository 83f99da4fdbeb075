"""A live run streaming into a real server while ``gradwatch db compact`` runs beside it (compaction tests)."""

from __future__ import annotations

import subprocess
import sys
import threading

from test_ingest_ws import Link, _columns_batch


def compact_while_streaming(server, db_url: str, record, layouts: dict, warm_at: int, min_steps: int):
    """Stream one step a batch (``record(step)`` -> (scalars, vectors)), run ``db compact`` once ``warm_at``
    steps are acked, keep streaming until it ends and ``min_steps`` are acked; returns (the compact
    process, the steps acked, how many were acked while it ran), after asserting both went through."""
    stop, warm, sent, errors = threading.Event(), threading.Event(), [], []

    def stream():
        try:
            link = Link(server.url, uid="live", secret="s")
            while not stop.is_set() or len(sent) < min_steps:
                step = len(sent)
                scalars, vectors = record(step)
                batch = _columns_batch(step + 1, [(step, 1.76e9 + step, scalars, vectors)], layouts=layouts)
                reply = link.send(batch)
                assert reply == {"type": "ack", "seq": step + 1}, reply
                sent.append(step)
                if len(sent) == warm_at:  # small rows of its own now wait in the server's cache: compaction merges them
                    warm.set()
            link.close()
        except Exception as exc:  # the assertion below shows it
            errors.append(exc)

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert warm.wait(timeout=60), errors
        at_start = len(sent)
        out = subprocess.run(
            [sys.executable, "-m", "gradwatch_server.cli", "db", "compact", "--db", db_url],
            capture_output=True,
            text=True,
            timeout=300,
        )
        during = len(sent) - at_start
    finally:
        stop.set()
        thread.join(timeout=120)
    assert out.returncode == 0 and errors == [], (out.stderr, errors)
    return out, sent, during
