"""TensorBoard: torch.utils.tensorboard.SummaryWriter writes event files (one add_scalar per key);
they reach disk on flush() or every flush_secs (120 s by default). Reader: TensorBoard's own
EventAccumulator, kept open and Reload()-ed as the TensorBoard server does."""

from __future__ import annotations

from .base import Tool as Base

ALL = {"scalars": 0}  # 0 = keep every point (TensorBoard's UI default keeps a 1,000-point reservoir sample)


class Tool(Base):
    name = "tensorboard"
    visible_means = "writer.flush() after log(), then EventAccumulator.Reload() returns the step " \
                    "(without flush(): up to flush_secs, 120 s by default)"

    def version(self) -> str:
        import tensorboard
        import torch
        return f"{tensorboard.__version__} (torch.utils.tensorboard, torch {torch.__version__})"

    def open(self, run: str) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self.dir = self.root / "tb" / run
        self.writer = SummaryWriter(log_dir=str(self.dir))
        self.acc = None

    def log(self, metrics: dict, step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def flush_for_read(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def _reader(self):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        return EventAccumulator(str(self.dir), size_guidance=ALL)

    def visible(self, key: str, step: int) -> bool:
        self.acc = self.acc or self._reader()
        self.acc.Reload()  # incremental: reads only what was appended since the last call
        return key in self.acc.Tags()["scalars"] and self.acc.Scalars(key)[-1].step >= step

    def read_series(self, key: str, max_points: int | None = None) -> int:
        acc = self._reader()
        acc.Reload()
        return len(acc.Scalars(key))
