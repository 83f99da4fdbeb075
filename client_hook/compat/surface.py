"""The W&B run methods a ``Run`` has besides log/watch/finish: ``config``, ``summary``, ``define_metric``,
``alert``, ``log(commit=False)`` merging, and the file/artifact calls that are accepted and ignored."""

from __future__ import annotations

import math
import time

from gradwatch import protocol
from gradwatch.compat import stubs
from gradwatch.compat.config import Config
from gradwatch.compat.summary import Summary
from gradwatch.media import route
from gradwatch.values import to_value

LEVELS = {"INFO": "info", "WARN": "warning", "WARNING": "warning", "ERROR": "critical", "CRITICAL": "critical"}
SUMMARIES = ("min", "max", "mean", "last", "best", "first", "none", "copy")


class WandbRunMixin:
    """Mixed into ``Run``: needs ``self.recorder`` and ``self.config`` (a mapping) when ``setup_wandb`` runs, and
    the run's ``_is_loss``/``_check_loss`` for the numbers nested dicts carry."""

    def setup_wandb(self) -> None:
        """Make ``config`` live and give the run a ``summary`` (called once the recorder exists)."""
        self.config = Config(self.config, on_change=lambda changes: self._put_run_event("config", changes))
        self.summary = Summary(on_change=self._summary_changed)
        self.metric_definitions: dict[str, dict] = {}
        self.pending_log: dict = {}
        self.pending_step: int | None = None
        self.layer_histograms: list = []

    def watch_histograms(self, model, which: str | None, every: int, optimizer=None) -> None:
        """Per-parameter gradient/weight histograms of a model (or a list of them, with a list of optimizers)
        every ``every``-th optimizer step (backward pass without one); the same model again replaces its own."""
        from gradwatch import watch_set
        from gradwatch.media.layer_histograms import LayerHistograms

        if not which:
            return
        for one, opt, _label in watch_set.pairs(model, optimizer, None):
            for old in [h for h in self.layer_histograms if h.model is one]:
                old.remove()
                self.layer_histograms.remove(old)
            self.layer_histograms.append(LayerHistograms(self.recorder, one, which, every, optimizer=opt))

    def unwatch_histograms(self) -> None:
        for hooks in self.layer_histograms:
            hooks.remove()
        self.layer_histograms = []

    def _put_run_event(self, kind: str, change: dict) -> None:
        from gradwatch.delivery import hello

        if not self.recorder.finished:
            self.recorder.put_event({"type": kind, kind: hello.jsonable(change)})

    def _summary_changed(self, values: dict, removed: list) -> None:
        from gradwatch.delivery import hello

        if not self.recorder.finished:
            self.recorder.put_event({"type": "summary", "set": hello.jsonable(values), "remove": removed})

    def merge_log(self, data, step: int | None, commit: bool | None) -> list:
        """W&B's ``log(commit=False)``: the (data, step) pairs to record now; held data waits for a committed call.

        A held step goes out first when a call names another step (W&B commits the older one then).
        """
        out = []
        if self.pending_log and step is not None and self.pending_step is not None and step != self.pending_step:
            out.append(self.flush_pending())
        if commit is False:
            self.pending_log.update(data)
            self.pending_step = step if step is not None else self.pending_step
            return out
        if self.pending_log:
            held, held_step = self.flush_pending()
            return [*out, ({**held, **data}, step if step is not None else held_step)]
        return [*out, (data, step)]

    def flush_pending(self) -> tuple[dict, int | None]:
        """What ``log(commit=False)`` still holds (sent at ``finish``)."""
        held, step = self.pending_log, self.pending_step
        self.pending_log, self.pending_step = {}, None
        return held, step

    # -- log() values that are not numbers (W&B's rules) ----------------------------------------
    def _not_a_number(self, key, value, exc: Exception, other: tuple | None) -> tuple | None:
        """A value ``to_value`` refused: set apart when it is media or a nested dict, else one warning line."""
        flat, media = route.split({key: value}) if not isinstance(exc, protocol.ProtocolError) else ({key: value}, {})
        if media or list(flat) != [key]:
            other = other or ({}, {})
            other[0].update(flat)
            other[1].update(media)
        else:
            self._not_logging(key, exc)
        return other

    def _not_logging(self, key, exc: Exception) -> None:
        shown = repr(key) if len(repr(key)) <= 60 else repr(key)[:40] + "..."
        self.recorder.warn_once(f"key:{key}", f"gradwatch: not logging {shown}: {exc}")

    def log_other(self, step: int, other: tuple, scalars: dict) -> None:
        """Nested dicts' numbers into ``scalars`` (checked like log()'s own); media values to the sender."""
        for key, value in other[0].items():
            try:
                is_loss = self._is_loss(key)
                scalars[key] = to_value(value)
            except (TypeError, ValueError, protocol.ProtocolError) as exc:
                self._not_logging(key, exc)
                continue
            if is_loss and type(scalars[key]) is float and not math.isfinite(scalars[key]):
                self._check_loss(step, key, scalars[key])
        route.put(self.recorder, step, other[1])

    def define_metric(
        self, name: str, step_metric: str | None = None, summary: str | None = None, goal: str | None = None, **_ignored
    ) -> dict:
        """Declare how a metric is shown: its x-axis (``step_metric``) and which summary the runs table shows.

        Args:
            name: a metric key, or a glob such as ``"val/*"``.
            step_metric: the key whose value is this metric's x-axis on the run page.
            summary: "min", "max", "mean", "last" (comma-separated for several), shown as the run's summary.
            goal: "minimize" or "maximize" (kept for the page).
        """
        spec = {"step_metric": step_metric, "summary": summary, "goal": goal}
        spec = {k: str(v) for k, v in spec.items() if v is not None}
        self.metric_definitions[str(name)] = spec
        self._put_run_event("meta", {"metrics": dict(self.metric_definitions)})
        return spec

    def alert(self, title: str, text: str = "", level: str = "INFO", wait_duration=None) -> None:
        """An alert on the run from the script (W&B's ``run.alert``): on the page, in its incidents and channels."""
        severity = LEVELS.get(str(getattr(level, "value", level)).upper(), "warning")
        self.recorder.put_event(
            {
                "type": "alert",
                "kind": "script_alert",
                "severity": severity,
                "step": self.recorder.current_step(),
                "key": str(title)[:256],
                "message": f"{title}: {text}"[:4000] if text else str(title)[:4000],
                "t": time.time(),
            }
        )

    # W&B's file and artifact calls: accepted, one warning line, nothing stored.
    def save(self, *args, **kwargs) -> list:
        return stubs.save(*args, **kwargs)

    def restore(self, *args, **kwargs) -> None:
        return stubs.restore(*args, **kwargs)

    def log_code(self, *args, **kwargs) -> None:
        return stubs.log_code(*args, **kwargs)

    def use_artifact(self, *args, **kwargs):
        return stubs.use_artifact(*args, **kwargs)

    def log_artifact(self, *args, **kwargs):
        return stubs.log_artifact(*args, **kwargs)

    def mark_preempting(self) -> None:
        stubs.say_once("mark_preempting")

    def unwatch(self, *_args) -> None:
        stubs.say_once("unwatch", "does nothing: gradwatch stops watching at finish()")
