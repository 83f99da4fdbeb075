"""The run's step clock: one pre/post hook pair per optimizer, one counter, and what subscribes to them.

Everything that happens "at the optimizer step" (gradient capture, layer signals, the step timer, the
step ``log()`` writes to) reads this clock or subscribes to it with ``on_before(fn, every=n)`` /
``on_after(fn, every=n)``. Subscribers get the step being taken; the clock advances only after every
after-subscriber ran, so none of them depends on the order it was registered in. Frameworks that
count steps themselves (Lightning, the Hugging Face ``Trainer``) ``pin`` the clock to their step.
"""

from __future__ import annotations

from collections.abc import Callable


class Subscription:
    """What ``StepClock.subscribe`` returns: ``due`` says whether the next (or current) step is sampled.

    Args:
        before, after: called with the step being taken, before / after the optimizer updates.
        every: only every N-th optimizer step seen since subscribing (the first one included).
        optimizer: only the steps of this optimizer (default: every optimizer the clock is attached to).
    """

    def __init__(self, clock: StepClock, before: Callable | None, after: Callable | None, every: int, optimizer=None):
        self.clock, self.before, self.after, self.optimizer = clock, before, after, optimizer
        self.every = max(1, int(every))
        self.seen = 0  # optimizer steps completed since subscribing

    @property
    def due(self) -> bool:
        """Whether the step being computed now is one this subscriber is called at."""
        return self.seen % self.every == 0

    def remove(self) -> None:
        """Stop being called."""
        if self in self.clock.subscribers:
            self.clock.subscribers.remove(self)


class StepClock:
    """Counts a run's optimizer steps and calls its subscribers around each one.

    Args:
        recorder: the run's ``Recorder`` (``current_step``, ``guarded``; ``claim_step`` once counting).
    """

    def __init__(self, recorder):
        self.recorder = recorder
        self.count = 0  # optimizer steps completed since the clock began counting
        self.base: int | None = None  # counting: the step of the first optimizer step (a continued run's next)
        self.pinned: int | None = None  # a framework's own step number
        self.subscribers: list[Subscription] = []
        self.hooks: dict[int, tuple] = {}  # id(optimizer) -> (optimizer, its two hook handles)
        self.taking: int | None = None  # the step between an optimizer's pre and post hook

    # -- what steps the clock -------------------------------------------------------------
    def attach(self, optimizer) -> None:
        """Tick on every ``optimizer.step()`` (hooked once per optimizer, however often attached)."""
        if id(optimizer) not in self.hooks:
            handles = (optimizer.register_step_pre_hook(self._pre), optimizer.register_step_post_hook(self._post))
            self.hooks[id(optimizer)] = (optimizer, handles)

    def detach_all(self) -> None:
        """Remove every optimizer hook (the run finished, or its watchers were removed)."""
        for _, handles in self.hooks.values():
            for handle in handles:
                handle.remove()
        self.hooks.clear()

    def count_from(self, base: int) -> None:
        """Run.watch: ``log()`` without ``step=`` follows the optimizer, whose first step here is ``base``."""
        self.base, self.count = base, 0

    def stop_counting(self) -> None:
        """``log()`` counts its own steps again."""
        self.base = None

    def pin(self, step: int) -> None:
        """A framework's hook: the step being trained now is ``step`` (it advances the clock itself)."""
        self.pinned = int(step)

    # -- reading it -----------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The step a capture made now is recorded at: the framework's, the one being taken, or the run's next."""
        if self.pinned is not None:
            return self.pinned
        return self.taking if self.taking is not None else self.recorder.current_step()

    def latest(self) -> int | None:
        """Where ``log()`` without ``step=`` goes while counting: the latest optimizer step (None: not counting)."""
        if self.base is None:
            return None
        return max(self.base + self.count - 1, 0)

    # -- subscribing ----------------------------------------------------------------------
    def subscribe(
        self, before: Callable | None = None, after: Callable | None = None, every: int = 1, optimizer=None
    ) -> Subscription:
        """Call ``before(step)`` / ``after(step)`` around every ``every``-th step (of ``optimizer``, if given)."""
        sub = Subscription(self, before, after, every, optimizer)
        self.subscribers.append(sub)
        return sub

    def on_before(self, fn: Callable[[int], None], every: int = 1, optimizer=None) -> Subscription:
        """Call ``fn(step)`` before the optimizer updates (gradients are final, weights not yet changed)."""
        return self.subscribe(before=fn, every=every, optimizer=optimizer)

    def on_after(self, fn: Callable[[int], None], every: int = 1, optimizer=None) -> Subscription:
        """Call ``fn(step)`` once the optimizer has updated the weights."""
        return self.subscribe(after=fn, every=every, optimizer=optimizer)

    # -- the optimizer hooks (the client's only step hooks) ---------------------------------
    def _pre(self, optimizer, args, kwargs) -> None:
        self.taking = self.step
        for sub in self._concerned(optimizer):
            if sub.before is not None and sub.due:
                self.recorder.guarded(lambda sub=sub: sub.before(self.taking))

    def _post(self, optimizer, args, kwargs) -> None:
        step = self.step  # a framework may have pinned its step inside step(closure)
        try:
            for sub in self._concerned(optimizer):
                if sub.after is not None and sub.due:
                    self.recorder.guarded(lambda sub=sub: sub.after(step))
        finally:
            for sub in self._concerned(optimizer):
                sub.seen += 1
            self.taking = None
            self.count += 1
            if self.base is not None:  # a log() without step= now belongs to this step
                self.recorder.guarded(lambda: self.recorder.claim_step(self.base + self.count - 1))

    def _concerned(self, optimizer) -> list:
        return [s for s in self.subscribers if s.optimizer is None or s.optimizer is optimizer]


def clock_of(recorder) -> StepClock:
    """The recorder's clock (a stand-in recorder without one gets its own, kept on it)."""
    clock = getattr(recorder, "clock", None)
    if clock is None:
        clock = StepClock(recorder)
        try:
            recorder.clock = clock
        except AttributeError:
            pass
    return clock
