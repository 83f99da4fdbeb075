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
    """Counts a run's training steps and calls its subscribers around each optimizer step.

    The step rule, with one optimizer or several: a training step ends once every optimizer the clock
    is attached to has stepped, or when an optimizer that already stepped in it steps again (so two
    optimizers stepped once per iteration make one step per iteration, and a critic stepped five times
    per generator step makes five). An AMP step that ``GradScaler`` skipped ends its step too (marked).

    Args:
        recorder: the run's ``Recorder`` (``current_step``, ``guarded``; ``claim_step`` once counting).
    """

    def __init__(self, recorder):
        self.recorder = recorder
        self.count = 0  # training steps completed
        self.base: int | None = None  # counting (Run.watch): log() without step= follows the clock
        self.last = -1  # the step of the latest completed training step
        self.pinned: int | None = None  # a framework's own step number
        self.subscribers: list[Subscription] = []
        self.ends: list[Callable] = []  # fn(step, skipped) when a training step ends
        self.scale_updates: list[Callable] = []  # fn(step, scaler) after each GradScaler.update
        self.hooks: dict[int, tuple] = {}  # id(optimizer) -> (optimizer, its two hook handles)
        self.scalers: dict[int, tuple] = {}  # id(scaler) -> (scaler, its original update)
        self.round: int | None = None  # the step of the training step under way (some optimizer stepped)
        self.stepped: set[int] = set()  # optimizers that stepped in it
        self.closure = False  # ... and that step was given a closure (gradients come inside it)
        self.moved = False  # an optimizer stepped since the last GradScaler.update

    # -- what steps the clock -------------------------------------------------------------
    def attach(self, optimizer) -> None:
        """Tick on every ``optimizer.step()`` (hooked once per optimizer, however often attached)."""
        if id(optimizer) not in self.hooks:
            handles = (optimizer.register_step_pre_hook(self._pre), optimizer.register_step_post_hook(self._post))
            self.hooks[id(optimizer)] = (optimizer, handles)

    def attach_scaler(self, scaler) -> None:
        """Hear every ``GradScaler.update`` (once per scaler): a step the scaler skipped ends as skipped."""
        if id(scaler) in self.scalers or scaler is None:
            return
        original = scaler.update

        def update(*args, **kwargs):
            result = original(*args, **kwargs)
            self.recorder.guarded(lambda: self._scaler_updated(scaler))
            return result

        scaler.update = update
        self.scalers[id(scaler)] = (scaler, original)

    def detach_all(self) -> None:
        """Remove every optimizer hook and scaler wrapper (the run finished)."""
        for _, handles in self.hooks.values():
            for handle in handles:
                handle.remove()
        self.hooks.clear()
        for scaler, _ in self.scalers.values():
            if "update" in vars(scaler):
                del scaler.update
        self.scalers.clear()

    def about_to_step(self, optimizer) -> None:
        """``optimizer`` will step soon (its gradients are being clipped): a step it already took is over."""
        if id(optimizer) in self.stepped:
            self._end(skipped=False)

    def count_from(self, base: int) -> None:
        """Run.watch: ``log()`` without ``step=`` follows the clock, whose first step here is ``base``."""
        if self.base is None:
            self.base, self.last = base, base - 1

    def stop_counting(self) -> None:
        """``log()`` counts its own steps again."""
        self.base = None

    def pin(self, step: int) -> None:
        """A framework's hook: the step being trained now is ``step`` (it advances the clock itself)."""
        self.pinned = int(step)

    # -- reading it -----------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The step a capture made now is recorded at: the framework's, the one under way, or the run's next."""
        if self.pinned is not None:
            return self.pinned
        return self.round if self.round is not None else self.recorder.current_step()

    def latest(self) -> int | None:
        """Where ``log()`` without ``step=`` goes while counting (None: not counting): the training step
        under way (a log inside ``step(closure)``, or between two optimizers' steps), else the latest one."""
        if self.base is None:
            return None
        return self.round if self.round is not None else max(self.last, 0)

    def recent(self) -> int:
        """The step a background sample (system counters) belongs to: the latest step logged or taken."""
        latest = self.latest()
        return latest if latest is not None else max(self.recorder.current_step() - 1, 0)

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

    def on_step_end(self, fn: Callable[[int, bool], None]) -> Callable:
        """Call ``fn(step, skipped)`` when a training step ends (``skipped``: GradScaler skipped it)."""
        self.ends.append(fn)
        return fn

    def on_scale_update(self, fn: Callable[[int, object], None]) -> Callable:
        """Call ``fn(step, scaler)`` after each ``GradScaler.update`` (the step it concluded)."""
        self.scale_updates.append(fn)
        return fn

    # -- the optimizer hooks (the client's only step hooks) ---------------------------------
    def _pre(self, optimizer, args, kwargs) -> None:
        if id(optimizer) in self.stepped:  # it steps again: the training step it was part of is over
            self._end(skipped=False)
        if self.round is None:
            self.round = self.step
        given = [a for a in args if a is not optimizer]  # the hook's args start with the optimizer itself
        self.closure = callable(kwargs.get("closure", given[0] if given else None))
        step = self.step
        for sub in self._concerned(optimizer):
            if sub.before is not None and sub.due:
                self.recorder.guarded(lambda sub=sub: sub.before(step))

    def _post(self, optimizer, args, kwargs) -> None:
        step = self.step  # a framework may have pinned its step inside step(closure)
        concerned = self._concerned(optimizer)
        try:
            for sub in concerned:
                if sub.after is not None and sub.due:
                    self.recorder.guarded(lambda sub=sub: sub.after(step))
        finally:
            for sub in concerned:
                sub.seen += 1
            self.closure = False
            self.moved = True
            self.stepped.add(id(optimizer))
            if self.stepped.issuperset(self.hooks):
                self._end(skipped=False)

    def _scaler_updated(self, scaler) -> None:
        if not self.moved:  # no optimizer stepped since the last update: the scaler skipped this step
            if self.round is None:
                self.round = self.step
            self._end(skipped=True)
        self.moved = False
        for fn in list(self.scale_updates):
            self.recorder.guarded(lambda fn=fn: fn(self.last if self.pinned is None else self.pinned, scaler))

    def _end(self, skipped: bool) -> None:
        """The training step under way is over: tell who listens, then count it."""
        step = self.pinned if self.pinned is not None else self.round
        self.round, self.stepped = None, set()
        for fn in list(self.ends):
            self.recorder.guarded(lambda fn=fn: fn(step, skipped))
        self.count += 1
        self.last = step
        if self.base is not None:  # a log() without step= now belongs to this step
            self.recorder.guarded(lambda: self.recorder.claim_step(step))

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
