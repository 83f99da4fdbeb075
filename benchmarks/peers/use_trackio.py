"""trackio (local mode): log() queues; a background thread bulk-inserts into a per-project SQLite
file under TRACKIO_DIR every 0.5 s. Reader: trackio's own ``SQLiteStorage``."""

from __future__ import annotations

import sqlite3

from .base import Tool as Base
from .base import env_dir


class Tool(Base):
    name = "trackio"
    visible_means = "SQLiteStorage.get_metric_values(project, run, key, step=s) returns the row"

    def __init__(self, root):
        super().__init__(root)
        env_dir("TRACKIO_DIR", root, "trackio")  # must be set before trackio is imported
        env_dir("HF_HOME", root, "hf")

    def version(self) -> str:
        import trackio
        return trackio.__version__

    def open(self, run: str) -> None:
        import trackio
        self.project, self.name_ = "bench", run
        self.run = trackio.init(project=self.project, name=run, auto_log_cpu=False, auto_log_gpu=False)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()

    def visible(self, key: str, step: int) -> bool:
        from trackio.sqlite_storage import SQLiteStorage
        try:
            return bool(SQLiteStorage.get_metric_values(self.project, self.name_, key, step=step))
        except sqlite3.OperationalError:  # "no such table" until the first batch is written
            return False

    def read_series(self, key: str, max_points: int | None = None) -> int:
        from trackio.sqlite_storage import SQLiteStorage
        return len(SQLiteStorage.get_metric_values(self.project, self.name_, key, max_points=max_points))
