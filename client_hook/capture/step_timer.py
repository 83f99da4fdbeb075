"""Step time, throughput and data-loader wait, from the optimizer's step and the model's forward (host clocks only).

``perf/step_time``: seconds between the ends of consecutive optimizer steps. ``perf/data_wait``: seconds from the
end of one optimizer step to the start of the next forward pass (loading the batch, and whatever else the loop
does there). ``perf/samples_per_sec``: ``batch_size`` / step time, when ``watch(batch_size=)`` was given. On a GPU
the host runs ahead of the device, but over consecutive steps the queue is full, so the step time is the
device's pace; nothing here waits for the device.
"""

from __future__ import annotations

import time

from gradwatch.capture.norms import ModuleHook
from gradwatch.contract import keys
from gradwatch.step_clock import clock_of

# gradwatch's own timers carry host-clock noise below a microsecond (and a rate's below its 4th digit):
# kept at that resolution they are short decimals the server stores in ~2 bytes instead of ~7
# (server/storage/blocks/decimal.py). A user's logged values are never rounded.


def microseconds(seconds: float) -> float:
    """A measured duration at 1 microsecond resolution."""
    return round(seconds, 6)


def four_digits(rate: float) -> float:
    """A measured rate to 4 significant digits."""
    return float(f"{rate:.4g}")


STEP_TIME = keys.STEP_TIME
DATA_WAIT = keys.DATA_WAIT
SAMPLES = keys.SAMPLES_PER_SEC


class StepTimer:
    """Times a training loop through a forward pre-hook on ``model`` and the run's step clock.

    Args:
        recorder: the run's ``Recorder``.
        model: what ``Run.watch`` was given.
        batch_size: samples per optimizer step, for ``perf/samples_per_sec`` (None: not recorded).
        optimizer: time only this optimizer's steps (default: every step of the clock).

    A time is recorded at the step the clock says is being taken (a framework's, when it pins one).
    """

    def __init__(self, recorder, model, batch_size: int | None = None, clock=time.perf_counter, optimizer=None):
        self.recorder, self.batch_size, self.clock = recorder, batch_size, clock
        self.last_end: float | None = None
        self.wait: float | None = None
        self.handle = model.register_forward_pre_hook(ModuleHook(self._on_forward))
        self.subscription = clock_of(recorder).on_after(self._on_step, optimizer=optimizer)

    def _on_forward(self, module, args) -> None:
        if self.last_end is not None and self.wait is None:  # the first forward after a step (not eval passes)
            self.wait = self.clock() - self.last_end

    def _on_step(self, step: int) -> None:
        now = self.clock()
        if self.last_end is not None:
            took = now - self.last_end
            scalars = {STEP_TIME: microseconds(took)}
            if self.wait is not None:
                scalars[DATA_WAIT] = microseconds(self.wait)
            if self.batch_size and took > 0:
                scalars[SAMPLES] = four_digits(self.batch_size / took)
            self.recorder.put_record(step, scalars, {})
        self.last_end, self.wait = now, None

    def remove(self) -> None:
        """Detach the hooks."""
        self.handle.remove()
        self.subscription.remove()
