"""Step time, throughput and data-loader wait, from the optimizer's step and the model's forward (host clocks only).

``perf/step_time``: seconds between the ends of consecutive optimizer steps. ``perf/data_wait``: seconds from the
end of one optimizer step to the start of the next forward pass (loading the batch, and whatever else the loop
does there). ``perf/samples_per_sec``: ``batch_size`` / step time, when ``watch(batch_size=)`` was given. On a GPU
the host runs ahead of the device, but over consecutive steps the queue is full, so the step time is the
device's pace; nothing here waits for the device.
"""

from __future__ import annotations

import time

STEP_TIME = "perf/step_time"
DATA_WAIT = "perf/data_wait"
SAMPLES = "perf/samples_per_sec"


class StepTimer:
    """Times a training loop through hooks on ``model`` (forward pre-hook) and ``optimizer`` (step post-hook).

    Args:
        recorder: the run's ``Recorder``.
        model, optimizer: what ``Run.watch`` was given.
        batch_size: samples per optimizer step, for ``perf/samples_per_sec`` (None: not recorded).
        step_now: the step a time is recorded at (default: the run's next one; frameworks give their own).
    """

    def __init__(
        self, recorder, model, optimizer, batch_size: int | None = None, clock=time.perf_counter, step_now=None
    ):
        self.recorder, self.batch_size, self.clock = recorder, batch_size, clock
        self.step_now = step_now or recorder.current_step
        self.last_end: float | None = None
        self.wait: float | None = None
        self.handles = [
            model.register_forward_pre_hook(self._on_forward),
            optimizer.register_step_post_hook(self._on_step),
        ]

    def _on_forward(self, module, args) -> None:
        if self.last_end is not None and self.wait is None:  # the first forward after a step (not eval passes)
            self.wait = self.clock() - self.last_end

    def _on_step(self, optimizer, args, kwargs) -> None:
        now = self.clock()
        if self.last_end is not None:
            took = now - self.last_end
            scalars = {STEP_TIME: took}
            if self.wait is not None:
                scalars[DATA_WAIT] = self.wait
            if self.batch_size and took > 0:
                scalars[SAMPLES] = self.batch_size / took
            self.recorder.guarded(lambda: self.recorder.put_record(self.step_now(), scalars, {}))
        self.last_end, self.wait = now, None

    def remove(self) -> None:
        """Detach the hooks."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
