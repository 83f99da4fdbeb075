"""Continuing a run from another process: what this machine remembers of each run it started.

A run's uid alone (it shows in URLs and logs) must not let anyone add to it: the server checks the
run secret. So every run leaves ``<uid>.json`` in ``directory()`` (mode 0600: the secret, the
last batch sequence number and step, the server's run id), updated when the run finishes, and
``init(id=..., resume=...)`` reads it back to send the same uid and secret, number its batches
after the last one, and count steps on from the last.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from gradwatch.delivery import spool

MODES = ("allow", "must")
_UID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def directory() -> Path:
    """Where the states are kept: beside the spool root, never in it (``gradwatch sync`` owns that).

    ``~/.cache/gradwatch/runs`` ($XDG_CACHE_HOME), or ``<dir>.runs`` beside $GRADWATCH_SPOOL_DIR.
    """
    root = spool.default_root()
    return root.with_name(root.name + ".runs") if os.environ.get("GRADWATCH_SPOOL_DIR") else root.parent / "runs"


def check_id(run_id: str) -> str:
    """A run id a script chooses: 1-64 letters, digits, ``-`` or ``_`` (it names a file)."""
    if not isinstance(run_id, str) or not _UID.fullmatch(run_id):
        raise ValueError(f"a run id is 1-64 letters, digits, '-' or '_', got {run_id!r}")
    return run_id


def load(uid: str) -> dict | None:
    """The remembered state of run ``uid``, or None."""
    try:
        return json.loads((directory() / f"{uid}.json").read_text())
    except (OSError, ValueError):
        return None


def remember(uid: str, **fields) -> None:
    """Merge ``fields`` into run ``uid``'s state; a failure to write is not the training job's problem."""
    try:
        where = directory()
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        state = {**(load(uid) or {}), **fields, "uid": uid}
        tmp = where / f"{uid}.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the run's secret
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(state))
        os.replace(tmp, where / f"{uid}.json")
    except OSError:
        pass


def _latest(match) -> dict | None:
    try:
        paths = sorted(directory().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for path in paths:
        state = load(path.stem)
        if state and match(state):
            return state
    return None


def find(resume, run_id: str | None, project: str, name: str | None) -> dict | None:
    """The state of the run to continue, or None for a new run.

    Args:
        resume: None/False: a new run, unless ``run_id`` names one this machine started;
            "allow"/True: continue ``run_id`` (or this project's latest run, with ``name`` if
            given) when there is one; "must": the same, and raise when there is none; an int: the
            server's id of the run; another string: the run's uid.
        run_id: the uid a script chose (``init(id=...)``).

    Raises:
        ValueError: resume="must" with nothing to continue, or a bad ``resume``.
    """
    if isinstance(resume, bool):
        resume = "allow" if resume else None
    if isinstance(resume, int):
        state = _latest(lambda s: s.get("run_id") == resume)
        if state is None:
            raise ValueError(f"no run with id {resume} was started on this machine (looked in {directory()})")
        return state
    if isinstance(resume, str) and resume not in MODES:
        run_id, resume = check_id(resume), "must"
    if resume not in (None, *MODES):
        raise ValueError(f"resume must be one of {MODES}, a run id or a uid, got {resume!r}")
    if run_id is not None:
        state = load(check_id(run_id))
    elif resume in ("allow", "must"):
        state = _latest(lambda s: s.get("project") == project and (name is None or s.get("name") == name))
    else:
        state = None
    if state is None and resume == "must":
        raise ValueError(f"nothing to resume: no run {run_id or f'in project {project!r}'} on this machine")
    return state
