"""The min/max envelope keeps every spike and NaN at any zoom."""

import math
import random

from gradwatch_server.storage.downsample import envelope


def test_single_spike_and_nan_survive_heavy_downsampling():
    rng = random.Random(0)
    values = [rng.random() for _ in range(1_000_000)]
    values[123_457] = 1e6
    values[777_777] = -1e6
    values[500_001] = math.nan
    values[900_000] = math.inf
    steps = list(range(len(values)))
    keep = envelope(steps, values, 400).tolist()
    kept = [values[i] for i in keep]
    assert len(keep) <= 400 + 2
    assert 1e6 in kept and -1e6 in kept and math.inf in kept and any(math.isnan(v) for v in kept)
    assert keep == sorted(keep) and keep[0] == 0 and keep[-1] == len(values) - 1


def test_everything_is_returned_when_it_fits():
    assert envelope([1, 2, 3], [1.0, 2.0, 3.0], 10).tolist() == [0, 1, 2]
