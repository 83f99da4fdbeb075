"""Slowdowns that are not the run's problem (other processes on the machine), served as information.

The throughput rule keeps, instead of raising an alert, a note for each slow stretch whose cause is outside
the run (cause.py). Notes are not stored: ``notes`` replays the run's step times and system counters through
a fresh rule state, so what the API shows is what the rule decided, never a red badge, an incident or a
notification.
"""

from __future__ import annotations

from gradwatch.contract import rules as specs
from gradwatch_server.health.common import Observation
from gradwatch_server.health.pace import cause, throughput
from gradwatch_server.storage import store

MAX_STEPS = 200_000  # the steps a replay reads (a longer run: its latest ones, read as a range, not sliced)


def notes(conn, run_id: int) -> list[dict]:
    """The run's contention notes in step order: first_step, last_step, step_time, usual, cause, evidence, message."""
    run = store.get_run(conn, run_id)
    th = specs.merged(run.get("alert_config"))
    have = set(store.list_keys(conn, run_id))
    start = None if run.get("last_step") is None else run["last_step"] - MAX_STEPS + 1
    columns = []
    for key in sorted(have.intersection({throughput.STEP_TIME, *cause.READS})):
        got = store.get_series(conn, run_id, key, start=start)
        values = [v if isinstance(v, (int, float)) else float("nan") for v in got["values"]]  # NaN comes encoded
        columns.append((key, got["steps"], values))
    order = sorted(  # a step's counters before its step time; one key's values at one step in stored order
        ((int(s), k == throughput.STEP_TIME, k, float(v)) for k, steps, vals in columns for s, v in zip(steps, vals)),
        key=lambda row: row[:2],
    )
    state: dict = {}
    for step, _, key, value in order:  # the counters of a step before its step time, as the client sends them
        throughput.check_throughput_drop(state, Observation(step, {key: value}), th)
    return [{"severity": "info", **n} for n in state.get("notes", [])]
