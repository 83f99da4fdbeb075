"""Rollups written lazily stay exact: every done block on disk equals a brute-force summary of its raw points.

Random streams go through the real ingest path (``apply_batch``): live steps one at a time, bulk
batches, sparse jumps, rewinds, a vector with missing slots, caches dropped at random (a restart),
and a run that ends. After every batch each block that ends at or before the key's newest step
must be stored and equal to ``rollup.summarise`` over the raw points; after the run ends, every block.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from sqlalchemy import func, select

from gradwatch import protocol
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.storage import chunks, database, db, rollup, store
from gradwatch_server.storage.blocks import rollup_cache, rollup_rows

KEYS = {"loss": 1, "acc": 1, "grad": 3}


def _wall(step: int) -> float:
    return 1000.0 + step * 0.5  # a step's wall time is fixed, so a tie between repeats of a step is no tie


def _value(rng: random.Random) -> float:
    roll = rng.random()
    if roll < 0.02:
        return math.nan
    if roll < 0.03:
        return rng.choice([math.inf, -math.inf])
    return rng.gauss(0, 1)


def _batches(rng: random.Random, n: int):
    """(steps, ends) of n batches: mostly live single steps, some bulk, sparse jumps and rewinds."""
    step = 0
    for _ in range(n):
        roll = rng.random()
        if roll < 0.6:
            steps = [step]
        elif roll < 0.75:
            steps = list(range(step, step + rng.randint(2, 400)))
        elif roll < 0.85:
            step += rng.randint(10, 3000)
            steps = [step]
        elif roll < 0.93:
            step = max(0, step - rng.randint(1, 500))
            steps = [step]
        else:
            steps = list(range(step, step + rng.randint(1, 5), rng.randint(1, 3)))
        step = steps[-1] + 1
        yield steps


def _records(rng: random.Random, steps: list) -> list:
    out = []
    for s in steps:
        vec = [_value(rng) if rng.random() > 0.1 else None for _ in range(KEYS["grad"])]
        vectors = {"grad": vec} if rng.random() > 0.2 else {}
        out.append((s, _wall(s), {"loss": _value(rng), "acc": _value(rng)}, vectors))
    return out


def _check(conn, run_id: int, everything: bool = False) -> int:
    """Blocks compared; asserts each done (or, with ``everything``, each) block equals its brute-force summary."""
    compared = 0
    for key_id, key in conn.execute(
        select(db.metric_keys.c.id, db.metric_keys.c.key).where(db.metric_keys.c.run_id == run_id)
    ):
        slots = KEYS[key]
        points = chunks.read(conn, key_id, slots=slots)
        if not len(points):
            continue
        top = int(points.steps.max())
        st = points.steps.astype(np.float64)
        # a key's levels are fixed by its first steps' gap (a sparse key keeps coarse ones only); readers
        # know them from its finest stored level, so every done block of each must be there
        levels = rollup.stored_levels(slots, rollup_rows.finest_level(conn, key_id))
        if everything and len(np.unique(points.steps)) >= rollup_cache.GAP_STEPS:
            assert levels, f"{key}: points at enough steps to choose its levels, and no rollups after the run ended"
        for level in levels:
            ids, counts, truth = rollup.summarise(
                st, points.walls, points.values, points.present(), points.steps // level
            )
            blocks, stored_counts, stored = rollup_rows.read_blocks(conn, key_id, level, 0, 1 << 40, slots)
            on_disk = {int(b): (int(n), d) for b, n, d in zip(blocks, stored_counts, stored)}
            for b, n, data in zip(ids.tolist(), counts.tolist(), truth):
                if not everything and (b + 1) * level - 1 > top:
                    continue  # not done: it may wait in the writer's cache
                assert b in on_disk, f"{key} level {level} block {b} (done, top {top}) is not stored"
                got_n, got = on_disk[b]
                assert got_n == n, f"{key} level {level} block {b}: count {got_n} != {n}"
                assert np.array_equal(got, data), f"{key} level {level} block {b}: summary differs"
                compared += 1
    return compared


@pytest.mark.parametrize("seed", range(6))
def test_done_blocks_on_disk_equal_their_raw_points_through_restarts_rewinds_and_the_end(tmp_path, seed):
    rng = random.Random(seed)
    engine = database.make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": f"r{seed}", "project": "p", "name": "r"}, {})["run_id"]
    state, compared = None, 0
    for seq, steps in enumerate(_batches(rng, 160), start=1):
        with engine.begin() as conn:
            if state is None or rng.random() < 0.08:
                state = load_state(conn, run_id)  # a fresh cache, as after a restart or an edit
            msg = {"type": "batch", "seq": seq, "columns": protocol.encode_columns(_records(rng, steps))}
            if seq == 1:
                msg["layouts"] = {"grad": ["a", "b", "c"]}
            apply_batch(conn, state, decode(msg))
        if seq % 4 == 0:  # every batch cost 3/4 of the test's time; a block stored wrong stays wrong till the end
            with engine.connect() as conn:
                compared += _check(conn, run_id)
    with engine.begin() as conn:
        end = {"type": "batch", "seq": 999, "events": [{"type": "status", "status": "finished"}]}
        apply_batch(conn, state, decode(end))
    with engine.connect() as conn:
        assert _check(conn, run_id, everything=True) > 0
    assert compared > 25


def test_live_steps_inside_one_block_write_no_rollup_rows(tmp_path):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "live", "project": "p", "name": "r"}, {})["run_id"]
        state = load_state(conn, run_id)

    def rows() -> int:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(db.rollups)).scalar()

    fine = rollup.levels_for(1)[0]
    for step in range(fine - 1):  # the finest scalar block is steps 0..fine-1
        with engine.begin() as conn:
            msg = {
                "type": "batch",
                "seq": step + 1,
                "columns": protocol.encode_columns([(step, _wall(step), {"loss": 1.0 / (step + 1)}, {})]),
            }
            apply_batch(conn, state, decode(msg))
    assert rows() == 0
    with engine.begin() as conn:  # its last step completes block 0 of the finest level: that one row, and no other
        last = [(fine - 1, _wall(fine - 1), {"loss": 0.5}, {})]
        msg = {"type": "batch", "seq": fine, "columns": protocol.encode_columns(last)}
        apply_batch(conn, state, decode(msg))
    assert rows() == 1
    with engine.connect() as conn:
        assert _check(conn, run_id) == 1


@pytest.mark.parametrize("widths", [(3, 4), (4, 3)])
def test_a_layout_change_mid_run_stores_every_block_without_a_conflict(tmp_path, widths):
    """A vector that gains or loses a layer: no batch fails, and after a restart and the end no block is missing."""
    engine = database.make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "layout", "project": "p", "name": "r"}, {})["run_id"]
    state = None
    for seq, step in enumerate(range(300), start=1):
        width = widths[0] if step < 100 else widths[1]
        with engine.begin() as conn:
            if state is None or step == 105:  # a restart just after the change
                state = load_state(conn, run_id)
            msg = {
                "type": "batch",
                "seq": seq,
                "columns": protocol.encode_columns([(step, _wall(step), {}, {"grad": [float(step)] * width})]),
            }
            if step in (0, 100):
                msg["layouts"] = {"grad": [f"l{i}" for i in range(width)]}
            apply_batch(conn, state, decode(msg))  # raises on a conflict
    with engine.begin() as conn:
        apply_batch(
            conn, state, decode({"type": "batch", "seq": 999, "events": [{"type": "status", "status": "finished"}]})
        )
    with engine.connect() as conn:
        key_id = conn.execute(select(db.metric_keys.c.id).where(db.metric_keys.c.key == "grad")).scalar()
        for level in rollup.LEVELS[:4]:
            stored = set(
                conn.execute(
                    select(db.rollups.c.block).where(db.rollups.c.key_id == key_id, db.rollups.c.level == level)
                ).scalars()
            )
            assert stored == set(range(300 // level + (300 % level > 0))), (level, sorted(stored))


def _heat_by_brute_force(points, bucket_of) -> list:
    """Each layer's bucket cells from raw points: a NaN wins, then +inf, then -inf, then the finite max."""
    cells: dict = {}
    for step, row, ok in zip(points.steps.tolist(), points.values.tolist(), points.present().tolist()):
        for layer, (v, present) in enumerate(zip(row, ok)):
            if present:
                cells.setdefault((bucket_of(step), layer), []).append(v)
    out = []
    for (bucket, layer), vs in sorted(cells.items()):
        kinds = [k for k, hit in (("NaN", any(math.isnan(v) for v in vs)), ("Infinity", math.inf in vs)) if hit]
        kinds += ["-Infinity"] if -math.inf in vs else []
        finite = [v for v in vs if math.isfinite(v)]
        out.append((bucket, layer, kinds[0] if kinds else max(finite)))
    return out


@pytest.mark.parametrize("stride", [5, 10, 40])
def test_a_sparse_key_keeps_only_levels_that_pay_and_reads_stay_exact(tmp_path, stride):
    """A key logged every ``stride`` steps (watch()'s update ratios: every 10th) writes no blocks too small to
    pay for themselves; through restarts (one before its levels are chosen), every done block of the levels it
    keeps is exact, and charts and heatmaps over it equal the raw points at every zoom."""
    engine = database.make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": f"s{stride}", "project": "p", "name": "r"}, {})["run_id"]
    rng, state, steps = random.Random(stride), None, 4096
    for step in range(steps):
        with engine.begin() as conn:
            if state is None or step in (stride * 2, 1234, 3001):  # the first: while its levels wait for more steps
                state = load_state(conn, run_id)
            vectors = {"grad": [_value(rng) for _ in range(KEYS["grad"])]} if step % stride == 0 else {}
            record = (step, _wall(step), {"loss": _value(rng), **({"acc": 1.0} if step % (stride * 10) == 0 else {})})
            msg = {"type": "batch", "seq": step + 1, "columns": protocol.encode_columns([(*record, vectors)])}
            if step == 0:
                msg["layouts"] = {"grad": ["a", "b", "c"]}
            apply_batch(conn, state, decode(msg))
        if step in (stride * 3, 2500):
            with engine.connect() as conn:
                _check(conn, run_id)
    with engine.begin() as conn:
        apply_batch(
            conn,
            state,
            decode({"type": "batch", "seq": steps + 1, "events": [{"type": "status", "status": "finished"}]}),
        )
    with engine.connect() as conn:
        assert _check(conn, run_id, everything=True) > 0
        ids = dict(conn.execute(select(db.metric_keys.c.key, db.metric_keys.c.id)).all())
        kept = {key: rollup.stored_levels(KEYS[key], rollup_rows.finest_level(conn, ids[key])) for key in ids}
        assert kept == {
            "loss": rollup.levels_for(1),
            "grad": rollup.levels_for(3, stride),
            "acc": rollup.levels_for(1, stride * 10),
        }
        assert (
            min(kept["grad"]) >= rollup.MIN_POINTS * stride > min(rollup.levels_for(3))
        )  # blocks of >= MIN_POINTS points only
        grad = chunks.read(conn, ids["grad"], slots=KEYS["grad"])
        for lo, hi, buckets in ((0, 4095, 16), (0, 4095, 4), (1000, 3100, 8), (1024, 3071, 33), (512, 1023, 512)):
            heat = store.get_heatmap(conn, run_id, "grad", max_steps=buckets, start=lo, end=hi)
            first, last = chunks.bounds(conn, ids["grad"], lo, hi)
            width, level = heat["bucket"], rollup.pick_level(heat["bucket"], kept["grad"])

            def bucket_of(step, first=first, last=last, width=width, level=level):
                """A block of the level read, lying wholly in the range, counts in the bucket its first step is in."""
                start = step if level is None else step // level * level
                whole = level is not None and start >= first and start + level - 1 <= last
                return ((start if whole else step) - first) // width

            at = [(s - first) // width for s in heat["steps"]]  # a column per bucket that has points
            got = [
                (at[b], layer, v)
                for layer, row in enumerate(heat["values"])
                for b, v in enumerate(row)
                if v is not None
            ]
            inside = grad.take(np.flatnonzero((grad.steps >= lo) & (grad.steps <= hi)))
            assert sorted(got) == _heat_by_brute_force(inside, bucket_of), (lo, hi, buckets)
            series = store.get_series(conn, run_id, "grad/b", max_points=4 * buckets, start=lo, end=hi)
            assert series["total_points"] == len(inside)  # every point counted, none lost between blocks
            raw = {int(s): v for s, v in zip(inside.steps.tolist(), inside.values[:, 1].tolist())}
            for s, v in zip(series["steps"], series["values"]):  # an envelope of real points, each as logged
                assert protocol.decode_float(v) == raw[s] or math.isnan(raw[s])
            finite = [v for v in raw.values() if math.isfinite(v)]
            shown = [protocol.decode_float(v) for v in series["values"]]
            assert max(finite) in shown and min(finite) in shown  # the spikes survive


def test_a_batch_that_goes_back_after_a_later_block_was_cached_stores_each_block_once(tmp_path):
    """Steps 0-3 and 40, then 20 (block 2 of 16, waiting in the cache, is written before block 1), then live steps to
    the end of block 2: the writer must still know block 2 is stored (it once forgot, and inserted it again)."""
    engine = database.make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "back", "project": "p", "name": "r"}, {})["run_id"]
        state = load_state(conn, run_id)
    for seq, steps in enumerate([[0, 1, 2, 3, 40], [20], *([s] for s in range(41, 48))], start=1):
        records = [(s, _wall(s), {}, {"grad": [float(s), 1.0, -1.0]}) for s in steps]
        msg = {"type": "batch", "seq": seq, "columns": protocol.encode_columns(records)}
        if seq == 1:
            msg["layouts"] = {"grad": ["a", "b", "c"]}
        with engine.begin() as conn:
            apply_batch(conn, state, decode(msg))  # raised a UNIQUE constraint error at step 47
    with engine.connect() as conn:
        assert _check(conn, run_id) > 0
