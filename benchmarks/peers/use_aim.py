"""Aim: ``Run(repo=…)`` writes through Aim's RocksDB-backed containers in a local .aim repo.
Readers find runs only through the repo's index, which ``aim up`` keeps with a RepoIndexManager
watching the run's chunk; here the reader calls that manager's ``index(run)`` itself before each
look (its cost is counted), then reads ``Repo.get_run(hash).get_metric(key, Context({}))``."""

from __future__ import annotations

from .base import Tool as Base


class Tool(Base):
    name = "aim"
    visible_means = "after RepoIndexManager.index(run) (what `aim up` runs on chunk changes), a separate " \
                    "Repo's get_run(hash).get_metric(key) has last_step() >= the step"

    def version(self) -> str:
        from aim.__version__ import __version__
        return __version__

    def open(self, run: str) -> None:
        from aim import Run
        self.repo_path = str(self.root / "aim")
        # no system-metrics sampler (the other tools get none either); terminal capture is left on (default)
        self.run = Run(repo=self.repo_path, experiment=run, system_tracking_interval=None)
        self.hash = self.run.hash
        self.reader = None

    def log(self, metrics: dict, step: int) -> None:
        self.run.track(metrics, step=step)  # a dict: one sequence per key, Aim's documented form

    def close(self) -> None:
        self.run.close()

    def _metric(self, repo, key: str):
        from aim.storage.context import Context
        run = repo.get_run(self.hash)
        return run.get_metric(key, Context({})) if run else None

    def _index(self, repo) -> None:
        from aim.sdk.index_manager import RepoIndexManager
        RepoIndexManager.get_index_manager(repo).index(self.hash)

    def visible(self, key: str, step: int) -> bool:
        from aim import Repo
        self.reader = self.reader or Repo(self.repo_path)
        self._index(self.reader)
        metric = self._metric(self.reader, key)
        return bool(metric) and metric.last_step() >= step

    def bulk_write(self, key: str, n: int) -> None:
        super().bulk_write(key, n)
        from aim import Repo
        self._index(Repo(self.repo_path))  # once, so reads find the finished run

    def read_series(self, key: str, max_points: int | None = None) -> int:
        from aim import Repo
        steps, values = self._metric(Repo(self.repo_path), key).values.sparse_numpy()
        return len(values)
