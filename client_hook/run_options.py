"""What a ``Run`` is started with besides its project, name and config: one checked options object.

``gradwatch.init(...)`` and ``Run(...)`` take these as keyword arguments (``server=``, ``on_nan=``, ...);
``RunOptions.of`` gathers and checks them once, at start, never at a connection attempt.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from gradwatch import protocol
from gradwatch.contract import OUTBOX_MEMORY_BYTES
from gradwatch.delivery import hello

ON_NAN_MODES = ("warn", "raise", "stop")


@dataclass
class RunOptions:
    """A run's options (see ``Run`` for what each one does)."""

    # what the server is told and checks
    alerts: Mapping | None = None
    tags: list | None = None
    loss_key: str | None = None
    on_nan: str = "warn"
    # where and how it is delivered
    server: str | None = None
    token: str | None = None
    flush_interval: float = 0.2
    spool_dir: str | None = None
    max_memory_bytes: int = OUTBOX_MEMORY_BYTES
    # which run it is
    all_ranks: bool = False
    id: str | None = None
    resume: str | int | bool | None = None
    # what W&B's init arguments add (gradwatch.compat.init_args): group, job_type, entity, notes; offline mode
    meta: Mapping | None = None
    offline: bool = False

    @classmethod
    def of(cls, given: RunOptions | None, kwargs: dict) -> RunOptions:
        """``given`` (or the defaults) with ``kwargs`` over it, checked.

        Raises:
            TypeError: an unknown option; ValueError, TypeError: a bad value (``check``).
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) for a run: {', '.join(unknown)}")
        options = dataclasses.replace(given or cls(), **kwargs)
        options.check()
        return options

    def check(self) -> None:
        """Validate in place: on_nan, alerts, tags, loss_key; fill server and token from the environment."""
        if self.on_nan not in ON_NAN_MODES:
            raise ValueError(f"on_nan must be one of {ON_NAN_MODES}, got {self.on_nan!r}")
        self.alerts, self.tags = hello.check_alerts(self.alerts), hello.check_tags(self.tags)
        self.loss_key = protocol.check_key(self.loss_key) if self.loss_key is not None else None
        self.server = (self.server or os.environ.get("GRADWATCH_SERVER") or protocol.DEFAULT_SERVER).rstrip("/")
        self.token = self.token or os.environ.get("GRADWATCH_TOKEN") or None  # kept for delivery; never stored
