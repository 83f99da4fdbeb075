"""Delivering spools that runs left on disk: ``gradwatch sync``, and older runs' spools once a new run
reaches the server.

Each spool is sent by a ``Sender`` over the batches loaded from disk, exactly as its run would have sent them.
"""

from __future__ import annotations

from pathlib import Path

from gradwatch.delivery import spool
from gradwatch.delivery.outbox import Outbox
from gradwatch.delivery.sender import Sender


def deliver(
    spool_dir: Path,
    server: str,
    token: str | None = None,
    patience: float = 30.0,
    quiet: bool = True,
    progress: bool = False,
) -> tuple[bool, int | None, str]:
    """Send one run's spool and remove it once delivered; returns (delivered, run id, why not).

    Skips (False, None, "in use ...") a spool that a live process holds. Idempotent: the server
    acks batches it already has without storing them twice.
    """
    lock = spool.Lock(spool_dir)
    if not lock.acquire():
        return False, None, "in use by a running training process"
    try:
        outbox = Outbox.load(spool_dir)
        if not len(outbox):
            spool.remove(spool_dir)
            return True, None, ""
        sender = Sender(server, spool.read_run_info(spool_dir), Path(spool_dir), outbox=outbox, token=token)
        sender.quiet = quiet
        sender.start()
        ok = sender.deliver(patience=patience, grace=3.0, progress=progress)
        sender.close()
        if ok:
            spool.remove(spool_dir)
            return True, sender.run_id, ""
        why = {
            "auth": "the server refused the token (set GRADWATCH_TOKEN)",
            "deleted": "the run was deleted on the server",
            "refused": "the server refused the run",
        }.get(sender.fatal or "", "")
        return False, sender.run_id, why or f"the server at {server} could not be reached or stopped answering"
    finally:
        lock.release()


def deliver_pending(root: Path, server: str, token: str | None = None, skip: Path | None = None) -> None:
    """Background delivery of older runs' spools (after a new run reached the server)."""
    for path in spool.pending_runs(root):
        if skip is not None and path.resolve() == Path(skip).resolve():
            continue
        meant_for = spool.read_run_info(path).get("server")
        if meant_for and meant_for.rstrip("/") != server.rstrip("/"):
            continue  # a run meant for another server waits for it (or for an explicit `gradwatch sync`)
        deliver(path, server, token, patience=10.0)
