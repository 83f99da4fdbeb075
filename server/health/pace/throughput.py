"""Health rule on the training loop's pace: a sustained throughput drop, raised only when the run itself slowed.

The client's step timer sends ``perf/step_time`` per optimizer step. A step time whose median over the last
``patience`` steps is so far above the run's median over ``window`` steps that throughput fell by ``fraction``
or more (and slower by at least ``min_delta`` seconds) is a slowdown. Before anything is raised the rule looks
at what the run's own counters say (cause.py): a torch DataLoader whose fetches grew (``perf/loader_wait``),
GPU clocks throttled for heat or power (NVML throttle reasons), or a process that slowed on a machine that
is not busy. Other processes taking the CPU (load above one per core, steal, the machine busy while this
process's share fell) are not the run's problem: no alert, only the note ``contention.py`` serves; nor is a
slowdown nothing measured can explain (no system counters).
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from gradwatch.contract import keys
from gradwatch_server.health.common import Alert, Observation, episode, fmt
from gradwatch_server.health.pace import cause
from gradwatch_server.health.rule import Columns, Rule

STEP_TIME = keys.STEP_TIME
MAX_NOTES = 100  # contention notes kept per run (a run on a shared machine may have many stretches)


def check_throughput_drop(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Step time sustained far above the run's own median (throughput down by a fraction), with a cause in the run."""
    cause.observe(state, obs.step, obs.scalars, th)
    t = obs.scalars.get(STEP_TIME)
    if t is None or not math.isfinite(t) or t <= 0:
        return []
    state["clock"] = state.get("clock", 0.0) + t  # seconds of steps so far: how long ago counters last came
    if obs.step < state.get("last_step", obs.step):  # a run resumed at an earlier step: its counters start anew
        cause.rewound(state)
    state["last_step"] = obs.step
    cause.stepped(state, obs.step, state["clock"])
    patience = int(th["throughput_drop.patience"])
    history = state.setdefault("history", deque(maxlen=int(th["throughput_drop.window"])))
    recent = state.setdefault("recent", deque(maxlen=patience))
    recent.append(t)
    slow = False
    if len(history) >= th["throughput_drop.min_history"] and len(recent) == patience:
        base, now = statistics.median(history), statistics.median(recent)
        limit = base / (1.0 - th["throughput_drop.fraction"])  # a step time this long is a slow one
        slow = base > 0 and now >= limit and now - base >= th["throughput_drop.min_delta"]  # ms jitter is no drop
    if not slow:
        state["calm"] = state.get("calm", 0) + 1
        if state["calm"] >= th["throughput_drop.cooldown"]:  # a slowdown that dips under the line is one stretch
            state["onset"], state["noting"] = None, False
        if state.get("onset") is None:  # the baseline learns from healthy steps only, not from a pending stretch's
            history.append(t)
        cause.healthy(state)
        episode(state, False, th["throughput_drop.cooldown"])
        return []
    found, state["calm"] = None, 0
    if not state.get("open"):
        late = [x for x in recent if x >= limit]
        if state.get("onset") is None:  # the stretch's first slow step, as if its slow steps ended the window
            state["onset"] = obs.step - len(late) + 1
        found = cause.of_slowdown(state, now, base, late, state["onset"])
        if found == cause.DEFER:  # the machine's counters are older than the slowdown: judged on fresh ones
            return []
        if found is None:
            _note(state, obs.step, now, base)
    if not episode(state, bool(state.get("open")) or found is not None, th["throughput_drop.cooldown"]):
        return []
    return [_alert(obs, now, base, found)]


def _note(state: dict, step: int, now: float, base: float) -> None:
    """A slowdown that is not the run's own: kept as a note (contention.py serves them), one per stretch."""
    notes = state.setdefault("notes", [])
    if state.get("noting") and notes:
        note = notes[-1]
        note["last_step"], note["step_time"] = step, max(note["step_time"], now)
        note.update(cause.verdict(state))  # the latest counters' say (counters that came back, say)
        return
    state["noting"] = True
    if len(notes) < MAX_NOTES:
        notes.append(
            {
                "first_step": state["onset"],  # set before any verdict: the stretch's first slow step
                "last_step": step,
                "step_time": now,
                "usual": base,
                **cause.verdict(state),
            }
        )


def _alert(obs: Observation, now: float, base: float, found: str) -> Alert:
    drop = 1.0 - base / now
    return Alert(
        "throughput_drop",
        obs.step,
        now,
        "warning",
        key=STEP_TIME,
        message=(
            f"Throughput fell {drop:.0%} at step {obs.step}: a step takes {fmt(now)} s (median of the last steps) "
            f"against the run's usual {fmt(base)} s. {found}"
        ),
    )


def bulk_throughput_drop(state: dict, cols: Columns) -> bool:
    """A batch without step times only feeds the cause's counters; one with them is checked record by record."""
    got = cols.scalars.get(STEP_TIME)
    if got is not None and len(got[0]):
        return False
    per_row: dict = {}  # the batch's counters record by record, in record order, as the live path sees them
    for key in cause.READS.intersection(cols.scalars):
        rows, values = cols.scalars[key]
        for row, value in zip(rows.tolist(), values.tolist()):
            per_row.setdefault(row, {})[key] = value
    for row in sorted(per_row):
        cause.observe(state, int(cols.steps[row]), per_row[row], cols.th)
    return True


RULES = (
    Rule(
        "throughput",
        "throughput_drop",
        check_throughput_drop,
        bulk_throughput_drop,
        reads=frozenset({STEP_TIME, *cause.READS}),
    ),
)
