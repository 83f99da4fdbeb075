"""Property-based fuzzing of the ingest path: any frame is stored, partly stored, or refused with a reason."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradwatch import protocol
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.storage import chunks, database

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["NaN", "Infinity", ""]),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=20,
)
record = st.fixed_dictionaries(
    {},
    optional={
        "step": st.one_of(st.integers(min_value=-2, max_value=2**64), json_value),
        "t": st.one_of(st.floats(), json_value),
        "scalars": st.one_of(st.dictionaries(st.text(max_size=5), json_leaf, max_size=3), json_value),
        "vectors": st.one_of(
            st.dictionaries(st.sampled_from(["grad", "x"]), st.lists(json_leaf, max_size=4), max_size=2), json_value
        ),
    },
)
batch_message = st.fixed_dictionaries(
    {"type": st.just("batch"), "seq": st.just(1)},
    optional={
        "records": st.one_of(st.lists(record, max_size=6), json_value),
        "layouts": st.one_of(
            st.dictionaries(st.sampled_from(["grad", "x"]), st.lists(st.text(max_size=4), max_size=4)), json_value
        ),
        "events": st.one_of(st.lists(json_value, max_size=3), json_value),
        "columns": json_value,
    },
)


@settings(max_examples=300, deadline=None)
@given(json_value)
def test_decode_columns_refuses_garbage_with_a_protocol_error(cols):
    try:
        protocol.decode_columns(cols)
    except protocol.ProtocolError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=batch_message)
def test_any_batch_is_stored_or_refused_never_crashes(tmp_path, message):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'fuzz.db'}")
    try:
        with engine.begin() as conn:
            run_id = open_run(conn, {"uid": "f", "project": "p", "name": "n"}, {})["run_id"]
            state = load_state(conn, run_id)
            result = apply_batch(conn, state, decode(message))
        assert result["refused"] is None or isinstance(result["refused"], str)
    finally:
        engine.dispose()
        (tmp_path / "fuzz.db").unlink(missing_ok=True)


values = st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none()), min_size=1, max_size=5)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**62), st.floats(allow_nan=False, allow_infinity=False), values),
        min_size=1,
        max_size=30,
    )
)
def test_columns_round_trip_bit_exact(rows):
    width = len(rows[0][2])
    records = [
        (s, t, {"v": v[0] if v[0] is not None else 0.0}, {"g": (v + [None] * width)[:width]}) for s, t, v in rows
    ]
    steps, walls, scalars, vectors = protocol.decode_columns(protocol.encode_columns(records))
    assert list(steps) == [r[0] for r in records] and list(walls) == [r[1] for r in records]
    got = np.frombuffer(scalars["v"][1], dtype="<f8")
    want = np.array([r[2]["v"] for r in records])
    assert got.tobytes() == want.astype("<f8").tobytes()  # NaN/inf bit-exact
    _rows, slots, data, missing = vectors["g"]
    flat = [x for r in records for x in r[3]["g"]]
    assert slots == width and [bool(m) for m in (missing or [0] * len(flat))] == [x is None for x in flat]
    assert all((x is None) or (math.isnan(x) and math.isnan(d)) or x == d for x, d in zip(flat, data))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 50), st.floats(allow_nan=True)), min_size=1, max_size=200), st.integers(1, 40))
def test_chunks_keep_every_point_in_step_order_across_batches(tmp_path, points, split):
    """Out-of-order and repeated steps, any batch sizes: reads give every point, stable by step."""
    engine = database.make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        tail = chunks.Tail()
        with engine.begin() as conn:
            for i in range(0, len(points), split):
                part = points[i : i + split]
                chunks.append_now(
                    conn,
                    tail,
                    1,
                    chunks.Points(
                        np.array([p[0] for p in part], dtype=np.int64),
                        np.arange(len(part), dtype=np.float64),
                        np.array([[p[1]] for p in part]),
                        None,
                    ),
                )
        with engine.connect() as conn:
            got = chunks.read(conn, 1)
        order = sorted(range(len(points)), key=lambda i: points[i][0])
        assert got.steps.tolist() == [points[i][0] for i in order]
        want = np.array([points[i][1] for i in order])
        assert got.values[:, 0].astype("<f8").tobytes() == want.astype("<f8").tobytes()
    finally:
        engine.dispose()
        (tmp_path / "c.db").unlink(missing_ok=True)
