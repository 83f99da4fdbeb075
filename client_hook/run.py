"""The ``Run``: what a training script holds while it streams to gradwatch."""

from __future__ import annotations

import math
import os
import secrets
import traceback
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gradwatch import metadata, protocol, signals, watch_set
from gradwatch.compat.surface import WandbRunMixin
from gradwatch.delivery import hello, spool
from gradwatch.delivery import pending as delivery
from gradwatch.delivery import resume as resuming
from gradwatch.delivery.sender import Sender
from gradwatch.integrations import distributed
from gradwatch.recorder import Recorder
from gradwatch.run_options import ON_NAN_MODES, RunOptions
from gradwatch.values import to_value

__all__ = ["ON_NAN_MODES", "Run", "RunOptions", "TrainingDiverged", "default_spool_root"]


class TrainingDiverged(RuntimeError):
    """Raised by ``log`` when the loss went NaN/inf and the run was started with on_nan="raise"."""


def default_spool_root() -> Path:
    """Where undelivered batches wait on disk: $GRADWATCH_SPOOL_DIR or ~/.cache/gradwatch/spool."""
    return spool.default_root()


class Run(WandbRunMixin):
    """One training run streaming to a gradwatch server.

    Args:
        project: group name for related runs.
        name: display name; defaults to a short random id.
        config: hyperparameters, shown on the run page and diffed in comparisons.
        server: server address; default $GRADWATCH_SERVER or http://127.0.0.1:8765.
        alerts: per-run health-rule thresholds, e.g. {"exploding_gradients.ceiling": 500}.
        on_nan: "warn" (print), "raise" (``log`` raises TrainingDiverged) or "stop"
            (``run.should_stop`` turns True) when a loss goes NaN/inf.
        tags: labels for filtering runs.
        flush_interval: longest wait before queued records are sent while a batch is in flight
            (an idle link sends at once).
        token: the server's token; default $GRADWATCH_TOKEN. Sent as a header, never stored.
        spool_dir: where undelivered batches wait on disk; default <spool root>/<run uid>, the root
            being $GRADWATCH_SPOOL_DIR or ~/.cache/gradwatch/spool.
        max_memory_bytes: memory for unacked batches before they go to disk.
        all_ranks: in a torch.distributed job, this rank streams a run of its own, named
            ``name [rank k]`` and grouped with the other ranks' runs (see gradwatch.distributed).
        loss_key: the key that is "the loss" of this run (runs list, compare); default: the first
            of ``gradwatch.contract.LOSS_KEYS`` it logs. The integrations set it.
        id: a run id of your choosing (letters, digits, - and _): the run's uid. When this machine
            started that run before, this process continues it (same server run, steps on).
        resume: "allow" (continue ``id``, or this project's latest run, if there is one), "must"
            (the same, or ValueError), the server's run id (int) or the run's uid (str). Only
            runs started on this machine can be continued: their secret is kept in
            ``~/.cache/gradwatch/runs`` (see gradwatch.delivery.resume).

        options: a ``RunOptions`` holding any of the above (keyword arguments override it).

    Raises:
        ValueError, TypeError: bad ``on_nan``, ``alerts``, ``tags`` or ``config``, or an unknown option
            (at once, not at every connection attempt).

    ``run.recorder`` (a ``gradwatch.recorder.Recorder``) is what integrations and tools record
    through; a training script needs only ``log``, ``watch`` and ``finish``.
    """

    def __init__(
        self,
        project: str = "default",
        name: str | None = None,
        config: Mapping | None = None,
        *,
        options: RunOptions | None = None,
        **kwargs,
    ):
        opts = self.options = RunOptions.of(options, kwargs)
        self.project = str(project)
        prior = resuming.find(opts.resume, opts.id, self.project, name)
        self.resumed = prior is not None
        self.uid = prior["uid"] if prior else (resuming.check_id(opts.id) if opts.id is not None else uuid.uuid4().hex)
        name = name or (prior or {}).get("name")
        self.name = str(name) if name else f"run-{self.uid[:6]}"
        job = distributed.describe(opts.all_ranks, self.uid, self.project, self.name)
        if "group" in job:
            self.name = f"{self.name} [rank {job['rank']}]"
        self.config = dict(config or {})
        self.loss_key, self.on_nan, self.server = opts.loss_key, opts.on_nan, opts.server
        self.should_stop = False
        self.diverged: tuple | None = None
        self._raise_pending: str | None = None
        self._key_is_loss: dict[str, bool] = {}  # keys already validated -> is it a loss?
        self._pid = os.getpid()
        self._sender = self._open_sender(prior, job)
        # What the watchers, integrations and importers record through (see gradwatch.recorder).
        self.recorder = Recorder(self._sender)
        self.setup_wandb()  # config kept live, summary, log(commit=False) (gradwatch.compat.surface)
        self._watched = watch_set.WatchSet(self.recorder)  # the models watch() was given
        self._first_step = int((prior or {}).get("step", 0))  # where a continued run's steps go on from
        if self._first_step:
            self.recorder.claim_step(self._first_step - 1)
        self.recorder.put_event({"type": "status", "status": "running"})
        self._sender.start()
        signals.track(self)

    def _open_sender(self, prior: dict | None, job: dict) -> Sender:
        """The sender that delivers this run, its hello ready; the run is remembered on this machine."""
        opts = self.options
        # The secret proves to the server that a reconnect (or `gradwatch sync` of the spool) is this run's.
        info = {
            "uid": self.uid,
            "secret": prior["secret"] if prior else secrets.token_hex(16),
            "project": self.project,
            "name": self.name,
            "config": hello.jsonable(self.config),
            "meta": {
                **metadata.collect(),
                **hello.jsonable(dict(opts.meta or {})),
                **job,
                **({"loss_key": self.loss_key} if self.loss_key else {}),
            },
            "alerts": opts.alerts,
            "tags": opts.tags,
        }
        where = Path(opts.spool_dir) if opts.spool_dir else default_spool_root() / self.uid
        sender = Sender(
            self.server,
            info,
            where,
            flush_interval=opts.flush_interval,
            max_memory_bytes=opts.max_memory_bytes,
            inspect=self._inspect_resolved,
            token=opts.token,
            start_seq=int((prior or {}).get("seq", 0)),  # a continued run numbers its batches on
        )
        resuming.remember(self.uid, secret=info["secret"], project=self.project, name=self.name, server=self.server)
        if opts.offline:  # mode="offline": never connect; finish() spools it all for `gradwatch sync`
            sender.link.fatal = "offline"
        if not opts.spool_dir:  # once this run reaches the server, spools that older runs left behind go too
            sender.on_connected = lambda: delivery.deliver_pending(
                default_spool_root(), self.server, opts.token, skip=where
            )
        return sender

    # -- public API ----------------------------------------------------------------------
    @property
    def id(self) -> int | None:
        """The run's id on the server (None until the server has answered)."""
        return self._sender.run_id

    @property
    def url(self) -> str:
        """Address of this run's page (the server's address until the server has answered)."""
        run_id = self._sender.run_id
        return f"{self.server}/runs/{run_id}" if run_id is not None else self.server

    @property
    def step(self) -> int:
        """The step the next ``log`` without ``step=`` will use."""
        latest = self.recorder.clock.latest()
        return latest if latest is not None else self.recorder.current_step()

    @property
    def forked(self) -> bool:
        """True in a forked child of the process that started the run (it records nothing there)."""
        return os.getpid() != self._pid

    @property
    def finished(self) -> bool:
        """True once ``finish`` began (``log`` then does nothing)."""
        return self.recorder.finished

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        """Record metrics for one step; never blocks and never raises into training.

        Args:
            data: metric name -> Python number or single-value tensor (any device, any dtype); also
                ``gradwatch.Histogram``/``Image`` (or a list)/``Table``, strings (text), arrays and
                multi-value tensors (histograms), nested dicts (flattened with "/"): docs/wandb.md.
            commit: False holds ``data`` and merges it into the next call that commits (W&B's rule).
            step: explicit step. Default: once ``watch`` knows an optimizer, the latest training step
                (so an eval metric logged between steps does not shift later steps; a log inside
                ``optimizer.step(closure)`` belongs to the step being taken); otherwise one more than
                the previous step (from 0). ``run.step`` is that step.

        Raises:
            TrainingDiverged: only with on_nan="raise", once a loss is NaN/inf.
        """
        if self.recorder.finished and self.forked:
            signals.say_not_in_worker()  # a forked child: the parent's run is not ours to log to
            return
        try:
            if commit is None and not self.pending_log:
                self._log(data, step)
            else:
                for part, at in self.merge_log(data, step, commit):
                    self._log(part, at)
        except Exception as exc:  # a bad call must not kill the training job
            self.recorder.warn_once(f"log:{type(exc).__name__}", f"gradwatch: log() ignored bad input: {exc}")
        if self._raise_pending:
            message, self._raise_pending = self._raise_pending, None
            raise TrainingDiverged(message)

    def watch(
        self,
        model,
        optimizer=None,
        scaler=None,
        every: int = 1,
        *,
        name: str | list | None = None,
        signals: bool = True,
        signals_every: int | None = None,
        on_nan: str | None = None,
        batch_size: int | None = None,
        system_every: float | None = 5.0,
        histograms: str | bool | None = None,
        histograms_every: int | None = None,
        **wandb,
    ) -> Run:
        """Record gradient norms (global and per parameter), missing grads, LR and memory.

        Called again, it adds a model (a GAN's two nets, one run); the same model again replaces its watch.
        Norms are what backward produced, before any clipping (docs/gradients.md).

        Args:
            model: the ``torch.nn.Module`` being trained, or a list of them (``[netD, netG]``).
            optimizer: its optimizer (a list, one per model); norms are captured when the step's gradients
                are final: at ``clip_grad_norm_`` or ``optimizer.step()``, for ``step(closure)`` after the
                closure. Without one, they are captured after every backward pass.
            name: the model's name in a run of several (its layers are ``<name>.<parameter>``; a list for a
                list of models); default: none for the first model, its index for the others.
            scaler: a ``torch.amp.GradScaler``, to record the loss scale and skipped steps.
            every: capture every N-th step (1 = all). Norms read every gradient once, which on
                a CPU-only run costs about one memory pass over the gradients.
            signals: with an optimizer, also record per-layer update/weight ratios (``update_ratio``) and
                module output RMS (``act_rms``), which the ``instability_warning`` rule reads, and name the
                module where a NaN/inf was born (a ``nan_provenance`` alert). See docs/alerts.md.
            signals_every: sample those signals every N-th optimizer step (default: 10, or ``every`` when larger;
                1: every step; the cost of each setting is in docs/alerts.md).
            on_nan: ``"skip"`` to skip an optimizer step whose gradients are NaN/inf (as GradScaler does),
                so one bad batch does not poison the weights; it reads one flag per step (a device sync).
            batch_size: samples per optimizer step, to record ``perf/samples_per_sec`` beside the step time
                and data-loader wait (``perf/step_time``, ``perf/data_wait``) recorded with an optimizer.
            system_every: seconds between samples of CPU, RAM, disk and network I/O (psutil) and per-GPU
                utilisation, memory, power, temperature, clocks and ECC errors (NVML), on a background
                thread (``pip install gradwatch[system]``; absent counters are left out). None: off.
            histograms: per-parameter histograms of "gradients" (True), "parameters" or "all", under
                ``gradients/<name>`` and ``parameters/<name>`` (no host-device sync; docs/wandb.md).
            histograms_every: every N-th optimizer step (without an optimizer, backward pass; default ``every``).
            **wandb: W&B's ``log=``, ``log_freq=``, ``criterion=``, ``idx=``, ``log_graph=`` (docs/wandb.md).

        Returns:
            The run, for chaining.
        """
        from gradwatch.compat.watch_args import translate

        optimizer, scaler, every, w_hist, w_every = translate(optimizer, scaler, every, wandb)
        histograms = "gradients" if histograms is True else (histograms or w_hist)
        if on_nan not in (None, "skip"):
            raise ValueError(f"watch(on_nan=...) must be None or 'skip', got {on_nan!r}")
        self.watch_histograms(model, histograms, histograms_every or w_every or every, optimizer)
        options = dict(
            scaler=scaler,
            every=every,
            signals=signals,
            signals_every=signals_every,
            on_nan=on_nan,
            batch_size=batch_size,
            system_every=system_every,
        )
        for one, opt, label in watch_set.pairs(model, optimizer, name):
            self._watched.add(one, opt, label, options)
            if opt is not None:  # a log() without step= now belongs to the latest training step
                self.recorder.clock.count_from(self._first_step)
        return self

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything logged so far is acknowledged by the server (or spooled while it is away).

        Args:
            timeout: seconds to wait at most.

        Returns:
            True once every record logged before the call is acked (or written to the spool because
            the server cannot be reached); False when ``timeout`` passed first.
        """
        if self.recorder.finished:
            return True
        return self.recorder.settle(timeout)

    def finish(
        self,
        status: str = "finished",
        timeout: float = 30.0,
        *,
        exit_code: int | None = None,
        quiet: bool | None = None,
        _budget: float | None = None,
    ) -> None:
        """Deliver everything to the server and mark the run ended; safe to call twice.

        Waits as long as the server keeps acknowledging (a progress line on stderr when that
        takes more than ~2 s); a server that cannot be reached is given about a second.
        What is not delivered stays on disk, and the message says how to send it later.

        Args:
            status: "finished" or "failed".
            timeout: seconds without any progress after which it stops waiting.
            exit_code: W&B's form: non-zero marks the run failed. ``quiet`` is accepted.
        """
        if self.recorder.finished:
            return
        if exit_code is not None:
            status = "failed" if exit_code else "finished"
        if self.pending_log:  # what log(commit=False) still held
            self.log(*self.flush_pending())
        self.recorder.finished = True
        sender = self._sender
        try:
            self._watched.remove_all()
            self.unwatch_histograms()
            self.recorder.clock.detach_all()
            self.recorder.clock.stop_counting()
            self.recorder.put_event({"type": "status", "status": status})
            sender.hurry_up()
            sender.deliver(patience=timeout, grace=3.0 if sender.ever_connected else 1.0, cap=_budget, progress=True)
        finally:  # even when a second Ctrl-C lands in the wait: spool what is left
            with signals.blocked():
                kept, lost = sender.close()
            signals.untrack(self)
            resuming.remember(self.uid, seq=sender.last_seq, step=self.recorder.current_step(), run_id=self.id)
            self._sender.say_what_is_left(kept, lost)

    def record_exception(self, exc: BaseException) -> None:
        """Attach a training-script exception (and the memory state) to the run."""
        event = {
            "type": "exception",
            "exc_type": type(exc).__name__,
            "message": str(exc)[:4000],
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:],
            "step": self.recorder.current_step(),
        }
        watcher = self._watched.first()
        if watcher is not None:
            try:
                event["memory"] = {**watcher.memory(), **watcher.memory_breakdown()}
            except Exception:
                pass
        self.recorder.put_event(event)

    def __getstate__(self):
        """A run does not travel to another process (spawn pickles what a worker gets): say what to do instead."""
        raise TypeError(
            "a gradwatch Run cannot be sent to another process: log from the process that called "
            "gradwatch.init(), or call gradwatch.init() inside each worker for a run per worker"
        )

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C: keep everything, but be quick about it
            self.finish("failed", _budget=signals.INTERRUPT_BUDGET_S)
        elif exc is not None and not isinstance(exc, TrainingDiverged):
            self.record_exception(exc)
            self.finish("failed")
        else:
            self.finish("finished" if exc is None else "failed")

    # -- internals ------------------------------------------------------------------------
    def _log(self, data: Mapping[str, Any], step: int | None) -> None:
        if self.recorder.finished:
            raise RuntimeError("the run is finished")
        if type(data) is not dict and not isinstance(data, Mapping):  # the ABC check alone costs ~1 us
            raise TypeError(f"log() takes a dict of metrics, got {type(data).__name__}")
        latest = self.recorder.clock.latest() if step is None else None
        if latest is not None:  # the latest optimizer step, not one of its own
            step = latest
        else:
            step = self.recorder.claim_step(step)
        scalars, other = {}, None
        for key, value in data.items():
            try:
                is_loss = self._is_loss(key)
                scalars[key] = to_value(value)
            except (TypeError, ValueError, protocol.ProtocolError) as exc:
                other = self._not_a_number(key, value, exc, other)
                continue
            if is_loss and type(scalars[key]) is float and not math.isfinite(scalars[key]):
                self._check_loss(step, key, scalars[key])
        if other is not None:  # nested dicts' numbers; histograms, images, tables, text (compat/surface.py)
            self.log_other(step, other, scalars)
        if scalars:
            self.recorder.put_record(step, scalars, {})

    def _is_loss(self, key) -> bool:
        """Whether a key is a loss (the usual names, or the run's declared ``loss_key``); checks the key once."""
        is_loss = self._key_is_loss.get(key)
        if is_loss is None:
            is_loss = self._key_is_loss[key] = protocol.is_loss_key(protocol.check_key(key)) or key == self.loss_key
        return is_loss

    def _inspect_resolved(self, step: int, scalars: dict) -> None:
        """Sender-thread check of losses that were read off the device late."""
        for key, value in scalars.items():
            if not math.isfinite(value) and self._is_loss(key):
                self._check_loss(step, key, value)

    def _check_loss(self, step: int, key: str, value: float) -> None:
        if math.isfinite(value) or self.diverged is not None:
            return
        self.diverged = (step, key, value)
        what = "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")
        message = (
            f"gradwatch: {key} is {what} at step {step}. Likely causes: learning rate too high, "
            "exploding gradients (try clipping), log/div of zero, or bad input data."
        )
        if self.on_nan == "stop":
            self.should_stop = True
            message += " run.should_stop is now True."
        elif self.on_nan == "raise":
            self._raise_pending = message
        warnings.warn(message, RuntimeWarning, stacklevel=_user_stacklevel())


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside gradwatch (the user's line)."""
    import inspect

    frame, level = inspect.currentframe().f_back, 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1
    return level
