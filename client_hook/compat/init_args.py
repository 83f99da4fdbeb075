"""What ``gradwatch.init`` makes of W&B's keyword arguments: kept, mapped, or ignored with one warning line."""

from __future__ import annotations

import os
import sys

MODES = ("online", "offline", "disabled")
# W&B arguments a run keeps as metadata (shown on the run page; group and job_type in the runs table and language).
META = ("entity", "group", "job_type")
# W&B arguments accepted and ignored: they are about W&B's service, its files or its UI.
IGNORED = (
    "dir",
    "settings",
    "reinit",
    "anonymous",
    "save_code",
    "sync_tensorboard",
    "monitor_gym",
    "magic",
    "allow_val_change",
    "config_exclude_keys",
    "config_include_keys",
    "force",
    "fork_from",
    "resume_from",
    "tensorboard",
)


def mode_of(mode: str | None) -> str:
    """The run's mode: the ``mode=`` argument, else $GRADWATCH_MODE, else $WANDB_MODE, else "online".

    "dryrun" (W&B's old name) means "offline"; anything else unknown is "online" with one warning line.
    """
    chosen = mode or os.environ.get("GRADWATCH_MODE") or os.environ.get("WANDB_MODE") or "online"
    chosen = {"dryrun": "offline", "run": "online"}.get(str(chosen).lower(), str(chosen).lower())
    if chosen not in MODES:
        print(f"gradwatch: mode {chosen!r} is not one of {', '.join(MODES)}; running online", file=sys.stderr)
        return "online"
    return chosen


def split(kwargs: dict, known: set) -> tuple[dict, dict, list]:
    """(the run's own options, the W&B metadata to keep, the names ignored) from ``init``'s keyword arguments.

    ``notes`` is kept in the run's metadata; ``tags`` may be a tuple; ``id``/``resume`` pass through
    (``resume=True`` is "allow", ``"never"`` is none).
    """
    run, meta, ignored = {}, {}, []
    for name, value in kwargs.items():
        if name in known:
            run[name] = value
        elif name in META or name == "notes":
            if value is not None:
                meta[name] = str(value)[:2000]
        else:
            ignored.append(name)
    if isinstance(run.get("tags"), tuple):  # W&B takes a tuple too; anything else is checked by the run
        run["tags"] = list(run["tags"])
    if "resume" in run:
        run["resume"] = {True: "allow", False: None, "never": None, "auto": "allow"}.get(run["resume"], run["resume"])
    return run, meta, ignored


def warn_ignored(names: list) -> None:
    """One line for the arguments that have no meaning here."""
    if names:
        print(
            f"gradwatch: init() ignores {', '.join(sorted(names))} (W&B-only arguments; see docs/wandb.md)",
            file=sys.stderr,
        )
