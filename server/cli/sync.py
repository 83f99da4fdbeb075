"""``gradwatch sync [DIR]``: deliver what training processes left on disk."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("sync", help="deliver batches a run left on disk when the server was unreachable")
    p.add_argument(
        "spool_dir",
        nargs="?",
        default=None,
        help="the directory printed by the run; without it, every pending run under the spool "
        "directory ($GRADWATCH_SPOOL_DIR or ~/.cache/gradwatch/spool)",
    )
    p.add_argument("--server", default=None, help="server address [$GRADWATCH_SERVER or http://127.0.0.1:8765]")


def run(args) -> int:
    return sync(args.spool_dir, args.server)


def sync(spool_dir: str | None = None, server: str | None = None, token: str | None = None) -> int:
    """Send spooled runs: one run's spool, every run under a spool root, or (no path) every pending run.

    Returns a process exit code: 0 when everything was delivered (or nothing was pending).
    """
    from gradwatch.delivery import pending as delivery
    from gradwatch.delivery import spool
    from gradwatch.protocol import DEFAULT_SERVER

    server = (server or os.environ.get("GRADWATCH_SERVER") or DEFAULT_SERVER).rstrip("/")
    token = token or os.environ.get("GRADWATCH_TOKEN") or None
    targets = _targets(spool_dir)
    if targets is None:
        return 2
    if not targets:
        print(f"gradwatch sync: nothing to send under {spool_dir or spool.default_root()}")
        return 0
    failed = 0
    for path in targets:
        ok, run_id, why = delivery.deliver(path, server, token, progress=True)  # a progress line past ~2 s
        if ok:
            where = f"run {run_id} is at {server}/runs/{run_id}" if run_id is not None else "nothing left to send"
            print(f"gradwatch sync: {path.name}: delivered; {where}")
        else:
            failed += 1
            print(f"gradwatch sync: {path}: not delivered: {why}", file=sys.stderr)
    return 1 if failed else 0


def _targets(spool_dir: str | None) -> list[Path] | None:
    """The run spools to deliver, or None (after saying why) when the path is not usable."""
    from gradwatch.delivery import spool

    if spool_dir is None:
        return spool.pending_runs(spool.default_root())
    path = Path(spool_dir)
    if not path.exists():
        print(f"gradwatch sync: {path} does not exist", file=sys.stderr)
        return None
    if (path / spool.INFO_NAME).is_file():
        return [path]
    runs = spool.pending_runs(path) if path.is_dir() else []
    if not runs:
        print(
            f"gradwatch sync: {path} has no run.json and no run spools in it; is it a gradwatch spool directory?",
            file=sys.stderr,
        )
        return None
    return runs
