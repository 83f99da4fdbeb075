"""Block summaries equal a brute-force scan, however a block's points are split across batches."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from gradwatch_server.storage import rollup


def _wall(step):
    return 1000.0 + step * 0.5 if step != rollup.NONE else rollup.NONE


def _brute(steps, values, present):
    """The summary of one block by looking at every point in order (walls: 1000 + step / 2)."""
    out = []
    for slot in range(values.shape[1]):
        pts = [(s, v[slot]) for s, v, p in zip(steps, values, present) if p[slot]]
        fin = [(s, v) for s, v in pts if math.isfinite(v)]
        lo = min(fin, key=lambda t: (t[1], t[0])) if fin else (rollup.NONE, math.inf)
        hi = min(fin, key=lambda t: (-t[1], t[0])) if fin else (rollup.NONE, -math.inf)

        def first(pred, pts=pts):
            return next((s for s, v in pts if pred(v)), rollup.NONE)

        named = [lo[0], hi[0], first(math.isnan), first(lambda v: v == math.inf), first(lambda v: v == -math.inf)]
        out.append([lo[1], lo[0], hi[1], hi[0], *named[2:], *[_wall(s) for s in named]])
    return np.array(out).T


@pytest.mark.parametrize("seed", range(20))
def test_summaries_match_brute_force_across_batch_splits(seed):
    rng = random.Random(seed)
    k, slots = rng.randint(1, 60), rng.randint(1, 4)
    steps = np.arange(k, dtype=np.float64) + rng.randint(0, 5)
    pool = [0.5, 1.0, -2.0, 3.0, math.nan, math.inf, -math.inf]  # repeats make ties that must go to the first step
    values = np.array([[rng.choice(pool) for _ in range(slots)] for _ in range(k)])
    present = np.array([[rng.random() > 0.2 for _ in range(slots)] for _ in range(k)])
    block = rollup.empty(slots)
    cuts = sorted(rng.sample(range(1, k), min(k - 1, rng.randint(0, 3)))) if k > 1 else []
    for lo, hi in zip([0, *cuts], [*cuts, k]):
        groups = np.zeros(hi - lo, dtype=np.int64)
        _, counts, data = rollup.summarise(
            steps[lo:hi], 1000.0 + steps[lo:hi] * 0.5, values[lo:hi], present[lo:hi], groups
        )
        rollup.merge(block, data[0], int(counts[0]))
    assert block.n == k
    np.testing.assert_array_equal(block.data, _brute(steps, values, present))


@pytest.mark.parametrize("seed", range(12))
def test_a_coarser_level_from_the_finer_blocks_equals_it_from_the_points(seed):
    rng = np.random.default_rng(seed)
    k, slots, fine = int(rng.integers(1, 400)), int(rng.integers(1, 5)), int(rng.choice([1, 4, 16]))
    steps = np.sort(rng.integers(0, 300, k)).astype(np.float64)  # repeated steps and gaps
    pool = np.array([0.5, 1.0, -2.0, 3.0, 0.0, -0.0, np.nan, np.inf, -np.inf])  # ties must go to the first point
    values = pool[rng.integers(0, len(pool), (k, slots))]
    present = rng.random((k, slots)) > 0.2
    walls = 1000.0 + steps * 0.5 + rng.random(k)  # a repeated step's points differ in wall time
    finest = rollup.summarise(steps, walls, values, present, (steps // fine).astype(np.int64))
    by_four = rollup.coarsen(*finest, 4)
    ways = {
        4: [by_four],
        16: [rollup.coarsen(*finest, 16), rollup.coarsen(*by_four, 4)],
        10**6: [rollup.coarsen(*finest, 10**6)],
    }
    for factor, got in ways.items():
        want = rollup.summarise(steps, walls, values, present, (steps // (fine * factor)).astype(np.int64))
        for coarse in got:  # bit for bit: +0.0 and -0.0 are equal to ==, not in their bytes
            assert [a.tobytes() for a in coarse] == [b.tobytes() for b in want], factor


def test_a_summarys_extreme_is_the_value_of_the_point_it_names():
    steps = np.arange(4, dtype=np.float64)
    values = np.array([[0.0], [-0.0], [-0.0], [0.0]])
    _, _, (data,) = rollup.summarise(steps, steps, values, np.ones_like(values, dtype=bool), np.zeros(4, np.int64))
    for v_row, s_row in ((rollup.MIN_V, rollup.MIN_S), (rollup.MAX_V, rollup.MAX_S)):
        assert data[s_row, 0] == 0.0 and np.signbit(data[v_row, 0]) == np.signbit(values[0, 0])


def test_summarise_splits_points_into_their_blocks():
    steps = np.arange(40, dtype=np.float64)
    values = steps[:, None].copy()
    values[21, 0] = math.nan
    ids, counts, data = rollup.summarise(
        steps, steps + 1000.0, values, np.ones_like(values, dtype=bool), (steps // 16).astype(np.int64)
    )
    assert ids.tolist() == [0, 1, 2] and counts.tolist() == [16, 16, 8]
    assert data[:, rollup.MAX_S, 0].tolist() == [15, 31, 39] and data[1, rollup.NAN_S, 0] == 21


def test_candidates_are_the_named_points_in_step_order():
    data = rollup.empty(1).data
    data[:, 0] = [-1.0, 9, 5.0, 3, 7, rollup.NONE, rollup.NONE, 109.0, 103.0, 107.0, rollup.NONE, rollup.NONE]
    steps, values, walls = rollup.candidates(data[None], 0)
    assert steps.tolist() == [3, 7, 9] and values[0] == 5.0 and math.isnan(values[1]) and values[2] == -1.0
    assert walls.tolist() == [103.0, 107.0, 109.0]  # each point keeps its own wall time


def test_heat_is_the_summary_maxima_and_which_non_finite_kinds_occurred():
    steps = np.arange(6, dtype=np.float64)
    values = np.array([[1.0, math.nan, -1.0], [2.0, 5.0, -math.inf], [math.inf, 4.0, -3.0]] * 2)
    present = np.ones_like(values, dtype=bool)
    present[:, 2] = [False, True, False, False, True, False]  # layer 2: only the -inf steps had a value
    _, _, data = rollup.summarise(steps, steps, values, present, np.zeros(6, dtype=np.int64))
    heat = rollup.heat_of(data[0])
    maxima, flags = rollup.heat_arrays(heat, 3)
    assert rollup.heat_arrays(heat, 4) is None  # another layout's heat is not read as this one's
    assert maxima.tolist() == [2.0, 5.0, -math.inf]
    assert flags.tolist() == [rollup.FLAG_PINF, rollup.FLAG_NAN, rollup.FLAG_NINF]
    assert (rollup.flags_of(data) == flags).all()


@pytest.mark.parametrize("seed", range(5))
def test_folding_one_point_equals_summarising_and_merging_it(seed):
    rng = np.random.default_rng(seed)
    pool = [0.5, -0.5, 2.0, math.nan, math.inf, -math.inf]
    block_a, block_b = rollup.empty(3), rollup.empty(3)
    for _ in range(200):
        step = float(rng.integers(0, 50))  # repeated steps and values: ties must resolve the same way
        values = [pool[i] for i in rng.integers(0, len(pool), 3)]
        present = (rng.random(3) > 0.2).tolist()
        _, _, data = rollup.summarise(
            np.array([step]), np.array([_wall(step)]), np.array([values]), np.array([present]), np.zeros(1, np.int64)
        )
        rollup.merge_into(block_a.data, data[0])
        rollup.fold_point(block_b.data, step, _wall(step), values, present)
        assert np.array_equal(block_a.data, block_b.data)


@pytest.mark.parametrize("slots", [5, 13, 300])
def test_a_0_2_heat_row_is_told_from_an_encoded_one_when_its_length_looks_encoded(slots):
    rng = np.random.default_rng(slots)
    maxima, flags = rng.normal(size=slots), rng.integers(0, 8, slots).astype(np.uint8)
    raw = maxima.astype("<f8").tobytes() + flags.tobytes()  # 9 bytes a slot: 5 modulo 8 for 5 and 13 slots
    assert rollup.heat_is_raw(raw, slots)
    got = rollup.heat_arrays(raw, slots)
    assert got[0].tolist() == maxima.tolist() and got[1].tolist() == flags.tolist()
    data = rollup.empty(slots).data
    data[rollup.MAX_V] = maxima
    encoded = rollup.heat_of(data)
    assert not rollup.heat_is_raw(encoded, slots) and rollup.heat_arrays(encoded, slots)[0].tolist() == maxima.tolist()
