"""The run's gradient board: what every watched model captured in one training step, recorded as one record.

Each ``Watcher`` hands its capture (a ``Part``: its layers' norms, its scalars) to the board of its run.
A part captured at an optimizer step waits for the end of the training step (the step clock says when),
so several models stepped in one iteration land in one record: one ``grad`` layout holding every model's
layers (prefixed with the model's name), the run-level ``grad/global_norm`` over all of them, and with
several models each one's own (``grad/global_norm/<name>``). Parts captured after backward or by a
framework are recorded at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gradwatch.contract import keys
from gradwatch.step_clock import clock_of
from gradwatch.values import defer_vector

SUMMED = (keys.MISSING_COUNT, keys.PARAMS_BYTES, keys.GRADS_BYTES, keys.OPTIMIZER_STATE_BYTES)


@dataclass
class Part:
    """One watcher's capture: norms of its present gradients (device vector or None), which slots lack one.

    ``clipped``: the norms after ``clip_grad_norm_`` (None: not clipped); ``threshold``: its max_norm.
    """

    names: list
    norms: object
    missing: list
    scalars: dict = field(default_factory=dict)
    clipped: object = None
    threshold: float | None = None


class Board:
    """Collects the watchers' parts of a run and records them (see the module docstring).

    Args:
        recorder: the run's ``Recorder``.
    """

    def __init__(self, recorder):
        import torch

        self.torch, self.recorder = torch, recorder
        self.watchers: list = []
        self.parts: dict = {}  # watcher -> Part, for the training step under way
        self.layout: list | None = None
        clock_of(recorder).on_step_end(lambda step, skipped: self.record(step, skipped))

    def join(self, watcher) -> None:
        """A watcher of this run: its layers take the next slots of the layout."""
        if watcher not in self.watchers:
            self.watchers.append(watcher)

    def leave(self, watcher) -> None:
        self.parts.pop(watcher, None)
        if watcher in self.watchers:
            self.watchers.remove(watcher)

    def put(self, watcher, step: int, part: Part, *, wait: bool) -> None:
        """Hand over ``part``; ``wait``: hold it until the training step ends, else record it now."""
        self.parts[watcher] = part
        if not wait:
            self.record(step)

    def record(self, step: int, skipped: bool = False) -> None:
        """Record the parts held (one record), every watcher's layers in one layout."""
        parts, self.parts = self.parts, {}
        scalars: dict = {keys.AMP_SKIPPED: 1.0} if skipped else {}
        if not parts:
            if scalars:
                self.recorder.put_record(step, scalars, {})
            return
        torch, names, present, clipped, missing = self.torch, [], [], [], []
        many = len(self.watchers) > 1
        for watcher in self.watchers + [w for w in parts if w not in self.watchers]:
            part = parts.get(watcher)
            if part is None:  # a model that captured nothing this step: its slots are missing
                missing += range(len(names), len(names) + len(watcher.names))
                names += watcher.names
                continue
            for key, value in part.scalars.items():
                scalars[key] = scalars[key] + value if key in SUMMED and key in scalars else value
            missing += [len(names) + i for i in part.missing]
            names += part.names
            if part.norms is not None:
                present.append(part.norms)
                clipped.append(part.clipped if part.clipped is not None else part.norms)
                if many:
                    scalars[keys.model_norm_key(watcher.label)] = defer_vector(torch.linalg.vector_norm(part.norms))
            if part.threshold is not None:
                scalars[keys.CLIP_THRESHOLD] = float(part.threshold)
        vectors = {}
        if present:
            norms = torch.cat([n.to(present[0].device) for n in present])
            scalars[keys.GLOBAL_NORM] = defer_vector(torch.linalg.vector_norm(norms))
            if any(p.clipped is not None for p in parts.values()):
                after = torch.cat([n.to(norms.device) for n in clipped])
                scalars[keys.GLOBAL_NORM_CLIPPED] = defer_vector(torch.linalg.vector_norm(after))
            vectors[keys.GRAD_VECTOR] = (defer_vector(norms), sorted(missing), len(names))
        elif names:
            vectors[keys.GRAD_VECTOR] = ([], sorted(missing), len(names))
        if names != self.layout:
            self.layout = list(names)
            self.recorder.put_layout(keys.GRAD_VECTOR, self.layout)  # before the first record that uses it
        self.recorder.put_record(step, scalars, vectors)


def board_of(recorder) -> Board:
    """The recorder's board (created on first use and kept on it)."""
    board = getattr(recorder, "board", None)
    if board is None:
        board = Board(recorder)
        try:
            recorder.board = board
        except AttributeError:
            pass
    return board
