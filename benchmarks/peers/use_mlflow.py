"""MLflow: local SQLite tracking store (sqlite:///…/mlflow.db, the store MLflow recommends over
./mlruns files); log_metrics is synchronous by default, so a point is stored when it returns.
Reader: MlflowClient.get_metric_history."""

from __future__ import annotations

import os
import time

from .base import Tool as Base

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # no network here anyway


class Tool(Base):
    name = "mlflow"
    visible_means = "MlflowClient.get_metric_history(run, key) contains the step (log_metrics is synchronous)"

    def __init__(self, root):
        super().__init__(root)
        import mlflow
        mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
        mlflow.set_experiment("bench")  # artifacts go to ./mlruns under the worker's cwd = root

    def version(self) -> str:
        import mlflow
        return mlflow.__version__

    def open(self, run: str) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient
        self.run_id = mlflow.start_run(run_name=run).info.run_id
        self.client = MlflowClient()

    def log(self, metrics: dict, step: int) -> None:
        import mlflow
        mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        import mlflow
        mlflow.end_run()

    def visible(self, key: str, step: int) -> bool:
        return any(m.step >= step for m in self.client.get_metric_history(self.run_id, key))

    def bulk_write(self, key: str, n: int) -> None:
        """log_batch takes at most 1,000 metrics a call: MLflow's own fast path."""
        from mlflow.entities import Metric
        self.open("bulk")
        now = int(time.time() * 1000)
        for lo in range(0, n, 1000):
            self.client.log_batch(self.run_id, metrics=[Metric(key, s * 1e-6, now, s) for s in range(lo, min(n, lo + 1000))])
        self.close()

    def read_series(self, key: str, max_points: int | None = None) -> int:
        from mlflow.tracking import MlflowClient
        return len(MlflowClient().get_metric_history(self.run_id, key))
