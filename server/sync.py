"""``gradwatch sync DIR``: deliver what a training process left on disk."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def sync(spool_dir: str, server: str | None = None) -> int:
    """Send the spooled batches of one run; returns a process exit code."""
    from gradwatch.outbox import Outbox
    from gradwatch.protocol import DEFAULT_SERVER
    from gradwatch.sender import Sender

    path = Path(spool_dir)
    info_file = path / "run.json"
    if not info_file.is_file():
        print(f"gradwatch sync: {path} has no run.json; is it a gradwatch spool directory?", file=sys.stderr)
        return 2
    outbox = Outbox.load(path)
    if not len(outbox):
        print("gradwatch sync: nothing left to send")
        return 0
    server = server or os.environ.get("GRADWATCH_SERVER") or DEFAULT_SERVER
    sender = Sender(server, json.loads(info_file.read_text()), path, outbox=outbox)
    sender.start()
    left = sender.close(timeout=120)
    if left:
        print(f"gradwatch sync: {left} batch(es) still undelivered (server {server})", file=sys.stderr)
        return 1
    print(f"gradwatch sync: delivered; run {sender.run_id} is at {server}/runs/{sender.run_id}")
    return 0
