"""gradwatch: the client streams to a ``gradwatch serve`` the benchmark started (GRADWATCH_SERVER);
visible = readable over the server's HTTP API; bytes = the server's SQLite file (+ WAL)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from .base import Tool as Base
from .base import wait_until


def _get(url: str):
    with urllib.request.urlopen(url, timeout=120) as resp:
        return json.loads(resp.read())


class Tool(Base):
    name = "gradwatch"
    visible_means = "GET /api/runs/{id}/series returns the step (stored in SQLite by the server)"

    def __init__(self, root: Path):
        super().__init__(root)
        self.url = os.environ.get("GRADWATCH_SERVER", "")  # absent only for the "version" task
        self.db = Path(os.environ.get("GRADWATCH_BENCH_DB", root / "none.db"))
        os.environ.setdefault("GRADWATCH_SPOOL_DIR", str(root / "spool"))

    def version(self) -> str:
        from importlib.metadata import version
        return version("gradwatch")

    def open(self, run: str) -> None:
        import gradwatch
        self.run = gradwatch.init(project="bench", name=run)
        wait_until(lambda: self.run.id is not None, 30)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish(timeout=600)

    def visible(self, key: str, step: int) -> bool:
        try:
            return bool(_get(f"{self.url}/api/runs/{self.run.id}/series?key={key}&start={step}&end={step}")["steps"])
        except urllib.error.HTTPError:  # 404 until the key's first point is stored
            return False

    def bulk_write(self, key: str, n: int) -> None:
        super().bulk_write(key, n)
        wait_until(lambda: self.visible(key, n - 1), 600, 0.05)

    def read_series(self, key: str, max_points: int | None = None) -> int:
        extra = f"&max_points={max_points}" if max_points else ""
        return len(_get(f"{self.url}/api/runs/{self.run.id}/series?key={key}{extra}")["values"])

    def stored_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.db.parent.glob(self.db.name + "*"))
