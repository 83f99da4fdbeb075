"""Big runs read through the rollups: fast, and still every spike, NaN and inf, at the right step."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from old_format import full_summaries
from sqlalchemy import delete, func, select

from gradwatch import protocol
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.storage import chunks, database, db, rollup, series, store
from gradwatch_server.storage.blocks import rollup_rows

N = 60_000
LAYERS = 6
SPIKES = {12_345: 1e6, 40_000: -1e6, 23_456: math.nan, 51_000: math.inf, 7: -math.inf}


def _value(i: int, rng: random.Random) -> float:
    return SPIKES.get(i, 1.0 / (1 + i * 1e-3) + rng.random() * 0.01)


def _vector(i: int) -> list:
    vec = [10.0 ** -(LAYERS - j) * (1 + (i % 7)) for j in range(LAYERS)]
    if i == 33_333:
        vec[2] = math.nan
    if i == 44_444:
        vec[4] = 1e9
    if i % 1000 == 999:
        vec[0] = None  # a step where layer 0 had no gradient
    return vec


def _ingest(engine, steps: range, restart_at: int | None = None) -> int:
    """Write through the real ingest path, in 500-step batches; optionally 'restart' the server midway."""
    rng = random.Random(0)
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "big-run", "project": "p", "name": "big"}, {})["run_id"]
    state = None
    seq = 0
    for lo in range(steps.start, steps.stop, 500):
        if state is None or (restart_at is not None and lo == restart_at):
            with engine.begin() as conn:
                state = load_state(conn, run_id)  # a fresh writer cache, as after a server restart
        seq += 1
        records = [
            {
                "step": i,
                "t": 1000.0 + i,
                "scalars": {"loss": protocol.encode_float(_value(i, rng))},
                "vectors": {"grad": [protocol.encode_float(v) for v in _vector(i)]},
            }
            for i in range(lo, min(lo + 500, steps.stop))
        ]
        msg = {
            "type": "batch",
            "seq": seq,
            "records": records,
            "layouts": {"grad": [f"l{j}" for j in range(LAYERS)]} if seq == 1 else {},
        }
        with engine.begin() as conn:
            apply_batch(conn, state, decode(msg))
    return run_id


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    engine = database.make_engine(f"sqlite:///{tmp_path_factory.mktemp('big') / 'big.db'}")
    run_id = _ingest(engine, range(N), restart_at=30_000 + 250 * 2)  # restart mid-block on purpose
    rng = random.Random(0)
    truth = [_value(i, rng) for i in range(N)]
    return engine, run_id, truth


def _decoded(series: dict) -> list[tuple[int, float]]:
    return [(s, math.nan if v is None else protocol.decode_float(v)) for s, v in zip(series["steps"], series["values"])]


@pytest.mark.parametrize("start,end", [(None, None), (5_000, 55_555), (12_000, 13_000), (0, 300)])
def test_envelope_from_rollups_is_real_points_and_keeps_every_outlier(big, start, end):
    engine, run_id, truth = big
    with engine.connect() as conn:
        s = store.get_series(conn, run_id, "loss", max_points=400, start=start, end=end)
    lo, hi = start or 0, N - 1 if end is None else end
    assert s["total_points"] == hi - lo + 1
    assert len(s["steps"]) <= 400 + 8 and s["steps"] == sorted(s["steps"])
    assert s["wall_times"] == [1000.0 + st for st in s["steps"]]
    for step, value in _decoded(s):
        want = truth[step]
        assert (math.isnan(value) and math.isnan(want)) or value == want, step
    inside = {st: v for st, v in SPIKES.items() if lo <= st <= hi}
    got = dict(_decoded(s))
    for st, v in inside.items():
        assert st in got and (got[st] == v or (math.isnan(v) and math.isnan(got[st]))), st
    finite = [v for v in truth[lo : hi + 1] if math.isfinite(v)]
    assert min(finite) in got.values() and max(finite) in got.values()


def test_full_resolution_without_max_points(big):
    engine, run_id, truth = big
    with engine.connect() as conn:
        s = store.get_series(conn, run_id, "loss", start=100, end=199)
    assert s["steps"] == list(range(100, 200)) and [protocol.decode_float(v) for v in s["values"]] == truth[100:200]


def test_a_key_is_found_by_name_and_a_missing_one_or_run_is_named(big):
    engine, run_id, truth = big
    with engine.connect() as conn:
        assert store.get_series(conn, run_id, "grad/l4", start=7, end=7)["steps"] == [7]  # a vector's layer
        for key in ("nope", "grad/nope", "grad/l4/x", "/" * 20_000, "g" * 300 + "/l4"):  # no 20,000 prefixes asked
            with pytest.raises(store.NotFound, match=f"not found in run {run_id}"):
                store.get_series(conn, run_id, key)
        with pytest.raises(store.NotFound, match="run 999 not found"):
            store.get_series(conn, 999, "loss")


def test_layer_series_from_rollups_keeps_the_nan_and_the_spike(big):
    engine, run_id, _ = big
    with engine.connect() as conn:
        nan_layer = dict(_decoded(store.get_series(conn, run_id, "grad/l2", max_points=200)))
        spike_layer = dict(_decoded(store.get_series(conn, run_id, "grad/l4", max_points=200)))
    assert math.isnan(nan_layer[33_333])
    assert spike_layer[44_444] == 1e9


def test_heatmap_matches_a_brute_force_bucket_max(big):
    engine, run_id, _ = big
    with engine.connect() as conn:
        heat = store.get_heatmap(conn, run_id, "grad", max_steps=-(-N // 256))
    assert heat["bucket"] == 256 and heat["layers"] == [f"l{j}" for j in range(LAYERS)]
    assert heat["steps"] == list(range(0, N, 256))[: len(heat["steps"])]
    vecs = np.array([[np.nan if v is None else v for v in _vector(i)] for i in range(N)])
    for col, start in enumerate(heat["steps"]):
        chunk = vecs[start : start + 256]
        for layer in range(LAYERS):
            got = heat["values"][layer][col]
            column = chunk[:, layer]
            if layer == 2 and start <= 33_333 < start + 256:
                assert got == "NaN"
            else:
                assert got == float(np.nanmax(column)), (layer, start)


def test_heatmap_of_a_zoomed_range_reads_raw_rows(big):
    engine, run_id, _ = big
    with engine.connect() as conn:
        heat = store.get_heatmap(conn, run_id, "grad", max_steps=800, start=33_300, end=34_000)
    assert heat["bucket"] == 1 and heat["steps"][0] == 33_300 and len(heat["steps"]) == 701
    assert heat["values"][2][33] == "NaN" and heat["values"][0][699] is None  # step 33_999: no grad in l0


def test_rollup_reads_fall_back_to_raw_when_the_layout_changed(tmp_path):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'layout.db'}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "u", "project": "p", "name": "n"}, {})["run_id"]
        state = load_state(conn, run_id)
    for seq, (width, lo) in enumerate([(2, 0), (3, 5000)], start=1):
        records = [
            {"step": i, "t": float(i), "scalars": {}, "vectors": {"grad": [float(i % 10)] * width}}
            for i in range(lo, lo + 5000)
        ]
        with engine.begin() as conn:
            apply_batch(
                conn,
                state,
                decode(
                    {
                        "type": "batch",
                        "seq": seq,
                        "records": records,
                        "layouts": {"grad": [f"l{j}" for j in range(width)]},
                    }
                ),
            )
    with engine.connect() as conn:
        s = store.get_series(conn, run_id, "grad/l0", max_points=40)
        heat = store.get_heatmap(conn, run_id, "grad", max_steps=10)
    assert s["total_points"] == 10_000 and max(protocol.decode_float(v) for v in s["values"]) == 9.0
    assert len(heat["values"]) == 3 and heat["values"][0][0] == 9.0


def _old_heatmap(conn, key_id: int, slots: int, max_steps: int, start, end) -> dict:
    """The heatmap as read before heat rows existed: every rollup row's full summary decoded."""
    lo, hi = chunks.bounds(conn, key_id, start, end)
    width = max(1, math.ceil((hi - lo + 1) / max(1, max_steps)))
    level = rollup.pick_level(width, rollup.stored_levels(slots, rollup_rows.finest_level(conn, key_id)))

    def raw_units(a, b):
        p = chunks.read(conn, key_id, a, b, slots)
        v, pr = p.values, p.present()
        return (
            p.steps,
            np.where(pr & np.isfinite(v), v, -np.inf),
            pr & np.isnan(v),
            pr & (v == np.inf),
            pr & (v == -np.inf),
        )

    units = None
    first, last = (-(-lo // level), (hi + 1) // level - 1) if level else (0, -1)
    if level and last >= first:
        blocks, _, s = rollup_rows.read_blocks(conn, key_id, level, first, last, slots)
        if s is not None:
            mid = (
                blocks * level,
                s[:, rollup.MAX_V],
                *(s[:, r] != rollup.NONE for r in (rollup.NAN_S, rollup.PINF_S, rollup.NINF_S)),
            )
            parts = (raw_units(lo, first * level - 1), mid, raw_units((last + 1) * level, hi))
            units = tuple(np.concatenate(x) for x in zip(*parts))
    steps, fmax, nan, pinf, ninf = units if units is not None else raw_units(lo, hi)
    bucket = (steps - lo) // width
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    top = np.maximum.reduceat(fmax, starts, axis=0)
    out = top.astype(object)
    out[top == -np.inf] = None
    for flag, value in zip((ninf, pinf, nan), (-math.inf, math.inf, math.nan)):
        out[np.logical_or.reduceat(flag, starts, axis=0)] = value
    values = [[None if v is None else protocol.encode_float(float(v)) for v in col] for col in out.T.tolist()]
    return {"steps": (lo + bucket[starts] * width).tolist(), "values": values, "bucket": width}


def _random_vector_run(engine, seed: int, slots: int, steps: int) -> int:
    """A vector key of random values (NaN, ±inf, no value) through real ingest, in random-sized batches."""
    rng = np.random.default_rng(seed)
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": f"r{seed}", "project": "p", "name": "n"}, {})["run_id"]
        state = load_state(conn, run_id)
    pool = [math.nan, math.inf, -math.inf, None]
    lo, seq = 0, 0
    while lo < steps:
        hi = min(steps, lo + int(rng.integers(1, 700)))
        seq += 1
        records = []
        for i in range(lo, hi):
            vec = [float(v) for v in rng.normal(size=slots) * 10.0 ** rng.integers(-3, 3)]
            for j in np.flatnonzero(rng.random(slots) < 0.004).tolist():
                vec[j] = pool[int(rng.integers(0, 4))]
            records.append(
                {"step": i, "t": float(i), "scalars": {}, "vectors": {"grad": [protocol.encode_float(v) for v in vec]}}
            )
        msg = {"type": "batch", "seq": seq, "records": records, "layouts": {"grad": [f"l{j}" for j in range(slots)]}}
        with engine.begin() as conn:
            apply_batch(conn, state, decode(msg))
        lo = hi
    return run_id


@pytest.mark.parametrize("seed", range(3))
def test_heatmap_from_heat_rows_equals_the_full_summary_read(tmp_path, seed):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'heat.db'}")
    slots = 7
    run_id = _random_vector_run(engine, seed, slots, 9_000)
    rng = np.random.default_rng(seed + 100)
    with engine.begin() as conn:
        key_id = conn.execute(select(db.metric_keys.c.id).where(db.metric_keys.c.run_id == run_id)).scalar()
        ranges = [(None, None, 400), (None, None, 37), (None, None, 9_000)]
        ranges += [
            (int(a), int(a + rng.integers(1, 6_000)), int(rng.integers(1, 500))) for a in rng.integers(0, 8_000, 6)
        ]

        def both():
            for start, end, cols in ranges:
                new = series.read_heatmap(conn, key_id, slots, cols, start, end)
                assert new == _old_heatmap(conn, key_id, slots, cols, start, end), (start, end, cols)

        both()
        assert conn.execute(select(func.count()).select_from(db.rollup_heat)).scalar() > 0
        h = db.rollup_heat.c
        full_summaries(conn)  # as stored before lean summaries, which need their heat rows
        conn.execute(delete(db.rollup_heat).where(h.block % 2 == 1))  # part of a run stored before heat rows
        both()
        conn.execute(delete(db.rollup_heat))  # a run stored before heat rows
        both()
