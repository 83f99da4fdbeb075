"""A batch off the wire as numpy columns, whichever form it came in; what cannot be read is listed, not fatal.

Two wire forms (gradwatch.protocol): ``columns`` (one packed array per key, decoded with a few
numpy calls) and the older ``records`` (a JSON object per step, decoded record by record). Both
become one ``Batch``. A record or column that is malformed is left out and described in
``Batch.problems``; everything else in the batch is still stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gradwatch import contract, protocol
from gradwatch_server.storage.chunks import FEW_STEPS, span


@dataclass
class Column:
    """One key's values in a batch: ``rows`` index the batch's steps (None: every step)."""

    rows: np.ndarray | None
    values: np.ndarray  # (k, slots) float64
    missing: np.ndarray | None  # (k, slots) bool, True = no value; None when none is missing


@dataclass
class Batch:
    seq: int
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    walls: np.ndarray = field(default_factory=lambda: np.zeros(0))
    scalars: dict = field(default_factory=dict)  # key -> Column (slots = 1)
    vectors: dict = field(default_factory=dict)  # key -> Column
    layouts: dict = field(default_factory=dict)  # key -> slot names
    events: list = field(default_factory=list)
    media: list = field(default_factory=list)  # histograms, images, tables, text: stored by ingest/media.py
    problems: list = field(default_factory=list)  # what could not be stored, and why
    decoding_problems: int = 0  # how many of those decoding found (applying may add more: see ingest)
    # Facts of ``steps`` found once (``set_steps``), in plain Python for a live batch (numpy's min/max
    # cost ~3 µs on two steps, asked several times a batch): oldest and newest step (None: no steps),
    # and whether the steps strictly increase (a live batch's do: the run clock then skips np.unique).
    oldest: int | None = field(default=None, init=False)
    newest: int | None = field(default=None, init=False)
    ascending: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.set_steps(self.steps, self.walls)

    def set_steps(self, steps: np.ndarray, walls: np.ndarray) -> None:
        """The batch's steps and wall times (one per record), and the facts of its steps."""
        self.steps, self.walls = steps, walls
        self.oldest = self.newest = None
        self.ascending = True
        if not len(steps):
            return
        self.oldest, self.newest = span(steps)
        if len(steps) <= FEW_STEPS:
            few = steps.tolist()
            self.ascending = all(a < b for a, b in zip(few, few[1:]))
        else:
            self.ascending = bool((steps[1:] > steps[:-1]).all())

    @property
    def points(self) -> int:
        return sum(len(c.values) * c.values.shape[1] for c in (*self.scalars.values(), *self.vectors.values()))

    def column_steps(self, column: Column) -> tuple[np.ndarray, np.ndarray]:
        """(steps, walls) of a column's values."""
        if column.rows is None:
            return self.steps, self.walls
        return self.steps[column.rows], self.walls[column.rows]


def decode(message: dict) -> Batch:
    """A batch message as a Batch; ProtocolError only when nothing of it can be trusted (no seq)."""
    seq = message.get("seq")
    if message.get("type") != "batch" or type(seq) is not int or seq < 1:
        raise protocol.ProtocolError("expected a batch with a positive integer seq")
    batch = Batch(seq)
    _layouts(batch, message.get("layouts"))
    events = message.get("events") or []
    if isinstance(events, list):
        batch.events = events
    else:
        batch.problems.append("batch.events must be a list")
    batch.media = message.get("media") if isinstance(message.get("media"), list) else []
    if "columns" in message:
        _from_columns(batch, message["columns"])
    else:
        _from_records(batch, message.get("records") or [])
    batch.decoding_problems = len(batch.problems)
    return batch


def _layouts(batch: Batch, layouts) -> None:
    if layouts is None:
        return
    if not isinstance(layouts, dict):
        batch.problems.append("batch.layouts must be an object")
        return
    for key, names in layouts.items():
        try:
            protocol.check_key(key)
        except protocol.ProtocolError as exc:
            batch.problems.append(f"layout: {exc}")
            continue
        if not isinstance(names, list):
            batch.problems.append(f"layout of {key!r} must be a list of names")
            continue
        batch.layouts[key] = [protocol.clean_text(n)[: contract.MAX_KEY_LEN] for n in names]


def _from_columns(batch: Batch, cols) -> None:
    try:
        steps, walls, scalars, vectors = protocol.decode_columns(cols)
    except protocol.ProtocolError as exc:
        batch.problems.append(f"columns: {exc}")
        return
    batch.set_steps(
        np.frombuffer(steps, dtype=np.int64) if len(steps) else np.zeros(0, np.int64),
        np.frombuffer(walls, dtype=np.float64) if len(walls) else np.zeros(0),
    )
    for key, (rows, values) in scalars.items():
        batch.scalars[key] = Column(_rows(rows), _f64(values).reshape(-1, 1), None)
    for key, (rows, slots, values, missing) in vectors.items():
        k = len(batch.steps) if rows is None else len(rows)
        gone = None if missing is None else (np.frombuffer(missing, dtype=np.uint8).reshape(k, slots) != 0)
        batch.vectors[key] = Column(
            _rows(rows), _f64(values).reshape(k, slots), gone if gone is not None and gone.any() else None
        )


def _f64(values) -> np.ndarray:
    return np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)


def _rows(rows) -> np.ndarray | None:
    return (
        None
        if rows is None
        else np.frombuffer(rows, dtype=np.int32).astype(np.intp)
        if len(rows)
        else np.zeros(0, np.intp)
    )


def _from_records(batch: Batch, records) -> None:
    """The older per-record form (old clients, old spools): decoded one record at a time."""
    if not isinstance(records, list):
        batch.problems.append("batch.records must be a list")
        return
    steps, walls, scalars, vectors = [], [], {}, {}
    for i, record in enumerate(records):
        try:
            step, wall, sc, vec = protocol.decode_record(record)
        except (protocol.ProtocolError, OverflowError) as exc:
            batch.problems.append(f"record {i}: {exc}")
            continue
        row = len(steps)
        steps.append(step)
        walls.append(wall)
        for key, value in sc.items():
            col = scalars.setdefault(key, ([], []))
            col[0].append(row)
            col[1].append(value)
        for key, values in vec.items():
            col = vectors.setdefault(key, ([], []))
            col[0].append(row)
            col[1].append(values)
    if any(s > protocol.MAX_STEP for s in steps):
        batch.problems.append("steps beyond 2**63-1 are not stored")
        return
    batch.set_steps(np.array(steps, dtype=np.int64), np.array(walls, dtype=np.float64))
    for key, (rows, values) in scalars.items():
        batch.scalars[key] = Column(
            np.array(rows, dtype=np.intp), np.array(values, dtype=np.float64).reshape(-1, 1), None
        )
    for key, (rows, values) in vectors.items():
        _vector_from_lists(batch, key, rows, values)


def _vector_from_lists(batch: Batch, key: str, rows: list, values: list) -> None:
    """Per-step lists as one Column; narrower steps (logged under an older, smaller layout) are padded
    with "no value" rather than refused."""
    width = max(len(v) for v in values)
    if all(len(v) == width and None not in v for v in values):
        batch.vectors[key] = Column(np.array(rows, dtype=np.intp), np.array(values, dtype=np.float64), None)
        return
    data = np.full((len(values), width), math.nan)
    gone = np.ones((len(values), width), dtype=bool)
    for i, v in enumerate(values):
        data[i, : len(v)] = [math.nan if x is None else x for x in v]
        gone[i, : len(v)] = [x is None for x in v]
    batch.vectors[key] = Column(np.array(rows, dtype=np.intp), data, gone)
