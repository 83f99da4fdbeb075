"""Health rules as pure functions over streams (no server, no torch)."""

from __future__ import annotations

import math
import random

from gradwatch_server.health import monitor as health
from gradwatch_server.health.monitor import Monitor, Observation, thresholds

TH = thresholds()
LAYERS = ["in.weight", "in.bias", "mid.weight", "mid.bias", "out.weight", "out.bias"]


def feed(monitor: Monitor, steps, layers=LAYERS):
    alerts = []
    for step, scalars, norms in steps:
        alerts += monitor.observe(step, scalars, {"grad": (layers, norms)} if norms is not None else {})
    return alerts


def losses(values, key="loss", start=0):
    return [(start + i, {key: v}, None) for i, v in enumerate(values)]


def test_nan_loss_fires_once_per_episode_at_exact_step():
    stream = losses([1.0, 0.9, math.nan, math.nan, math.inf, 0.5, -math.inf])
    alerts = feed(Monitor(), stream)
    assert [(a.kind, a.step, a.confirmed_step) for a in alerts] == [("nan_loss", 2, 2)]
    assert "NaN" in alerts[0].message
    # A NaN after a sustained finite stretch (nan_loss.cooldown) is a new episode.
    monitor = Monitor()
    alerts = feed(monitor, stream + losses([0.5] * 10 + [math.inf], start=7))
    assert [(a.kind, a.step) for a in alerts] == [("nan_loss", 2), ("nan_loss", 17)]
    assert "+inf" in alerts[1].message


def test_exploding_relative_to_own_history_and_absolute_ceiling():
    steady = [(i, {"grad/global_norm": 1.0 + 0.1 * (i % 3)}, [1.0] * 6) for i in range(30)]
    alerts = feed(Monitor(), steady + [(30, {"grad/global_norm": 500.0}, [1, 1, 1, 1, 1, 500.0])])
    assert [a.kind for a in alerts] == ["exploding_gradients"]
    assert alerts[0].layer == "out.bias" and alerts[0].step == 30
    assert feed(Monitor(), [(0, {"grad/global_norm": 5000.0}, None)])[0].kind == "exploding_gradients"


def test_exploding_at_step_one_against_the_first_steps_even_under_the_ceiling():
    alerts = feed(Monitor(), [(0, {"grad/global_norm": 0.167}, None), (1, {"grad/global_norm": 502.0}, None)])
    assert [(a.kind, a.step) for a in alerts] == [("exploding_gradients", 1)]
    assert "first steps" in alerts[0].message
    # Ordinary early movement (100x is not 1000x) is not.
    assert feed(Monitor(), [(0, {"grad/global_norm": 0.1}, None), (1, {"grad/global_norm": 10.0}, None)]) == []


def test_a_flickering_explosion_is_one_alert_until_a_sustained_healthy_stretch():
    stream = [(i, {"grad/global_norm": 1.0}, None) for i in range(20)]
    stream += [(20 + i, {"grad/global_norm": 1e4 if i % 2 == 0 else 1.0}, None) for i in range(41)]
    assert len(feed(Monitor(), stream)) == 1
    cooldown = int(TH["exploding_gradients.cooldown"])
    calm = [(61 + i, {"grad/global_norm": 1.0}, None) for i in range(cooldown)]
    again = [(61 + cooldown, {"grad/global_norm": 1e4}, None)]
    assert [a.step for a in feed(Monitor(), stream + calm + again)] == [20, 61 + cooldown]
    assert len(feed(Monitor(), stream + calm[:-1] + again)) == 1


def test_loss_that_blows_up_without_nan_is_named_at_the_step_it_diverges():
    alerts = feed(Monitor(), losses([0.68, 9204.0, 5000.0, 8000.0]))
    assert [(a.kind, a.step, a.key) for a in alerts] == [("loss_divergence", 1, "loss")]
    assert "loss diverged at step 1" in alerts[0].message and "13,535x its first value" in alerts[0].message
    # The RNN of the issue: 9.64 -> 9.82 -> 387, then 15-60x its start for the rest of the run: one alert.
    rnn = [9.64, 9.82, 387.0] + [9.64 * (15 + 45 * (i % 2)) for i in range(60)]
    alerts = feed(Monitor(), losses(rnn, key="train/loss"))
    assert [(a.kind, a.step, a.key) for a in alerts] == [("loss_divergence", 2, "train/loss")]


def test_healthy_loss_shapes_are_not_divergence():
    rng = random.Random(0)
    shapes = {
        "drop": [2.3 * math.exp(-i / 10) + 0.01 for i in range(200)],
        "warmup bump": [2.3 + 0.5 * math.sin(i / 5) for i in range(100)],
        "kl creeping up": [1e-3 * 1.08**i for i in range(120)],  # 0.001 -> 10 over 120 steps
        "starts at zero": [0.0] * 5 + [0.3 * (1 + 0.2 * math.sin(i)) for i in range(50)],
        "noisy batches of 8": [sum(rng.lognormvariate(0, 1.0) for _ in range(8)) / 8 for _ in range(2000)],
        "converges to tiny": [1e-7 * rng.lognormvariate(0, 2.0) if i > 20 else 1.0 / (i + 1) for i in range(400)],
    }
    for name, values in shapes.items():
        found = [a for a in feed(Monitor(), losses(values)) if a.kind == "loss_divergence"]
        assert found == [], name


def test_tiny_gradients_of_a_converged_run_are_not_vanishing():
    stream = [(i, {"grad/global_norm": 1e-9}, [1e-9] * 6) for i in range(100)]
    assert feed(Monitor(), stream) == []


def test_vanishing_reports_where_it_started_and_where_it_was_confirmed():
    norms = [1e-8, 1e-8, 1e-5, 1e-5, 1e-1, 1e-1]
    alerts = feed(Monitor(), [(i, {"grad/global_norm": 0.14}, norms) for i in range(25)])
    assert [(a.kind, a.step, a.confirmed_step, a.layer) for a in alerts] == [
        ("vanishing_gradients", 0, 19, "in.weight")
    ]


def test_zero_and_missing_gradients_name_the_parameters_and_their_first_bad_step():
    norms = [0.0, 0.0, None, None, 1.0, 1.0]
    alerts = feed(
        Monitor(),
        [(i, {"grad/global_norm": 1.4}, [1.0] * 6) for i in range(3)]
        + [(3 + i, {"grad/global_norm": 1.4}, norms) for i in range(25)],
    )
    kinds = {a.kind: a for a in alerts}
    assert set(kinds) == {"zero_gradients", "missing_gradients"}
    missing = kinds["missing_gradients"]
    assert (missing.step, missing.confirmed_step) == (3, 7) and "mid" in missing.message
    assert (kinds["zero_gradients"].step, kinds["zero_gradients"].confirmed_step) == (3, 22)
    assert kinds["zero_gradients"].layer == "in.weight"


def test_a_layer_dropped_from_the_layout_is_forgotten():
    # mid.* get no gradient for 4 steps, then are frozen (the client drops them from the layout).
    stream = [(i, {"grad/global_norm": 1.0}, [1.0, 1.0, None, None, 1.0, 1.0]) for i in range(4)]
    kept = ["in.weight", "in.bias", "out.weight", "out.bias"]
    monitor = Monitor()
    alerts = feed(monitor, stream) + feed(
        monitor, [(4 + i, {"grad/global_norm": 1.0}, [1.0] * 4) for i in range(30)], layers=kept
    )
    assert alerts == []


def test_global_norm_exactly_zero_says_graph_is_disconnected():
    alerts = feed(Monitor(), [(i, {"grad/global_norm": 0.0}, [0.0] * 6) for i in range(20)])
    assert alerts[0].kind == "zero_gradients" and alerts[0].severity == "critical"
    assert "not connected" in alerts[0].message


def test_loss_spike_against_robust_spread_but_not_on_noise():
    noisy = [(i, {"loss": 1.0 + 0.05 * math.sin(i)}, None) for i in range(60)]
    assert feed(Monitor(), noisy) == []
    alerts = feed(Monitor(), noisy + [(60, {"loss": 8.0}, None), (61, {"loss": 1.0}, None), (62, {"loss": 9.0}, None)])
    assert [(a.kind, a.step) for a in alerts] == [("loss_spike", 60)]


def test_memory_pressure_against_the_capacity_the_watcher_sends():
    alerts = feed(
        Monitor(),
        [
            (0, {"memory/cuda_reserved": 50.0, "memory/cuda_total": 80.0}, None),
            (1, {"memory/cuda_reserved": 79.0}, None),
        ],
    )
    assert [(a.kind, a.step) for a in alerts] == [("memory_pressure", 1)]


def test_memory_pressure_uses_device_capacity():
    monitor = Monitor(meta={"cuda_total_memory": 80 * 2**30})
    alerts = feed(
        monitor, [(0, {"memory/cuda_reserved": 50.0 * 2**30}, None), (1, {"memory/cuda_reserved": 79.0 * 2**30}, None)]
    )
    assert [(a.kind, a.step) for a in alerts] == [("memory_pressure", 1)]


def test_amp_overflow_counts_scale_drops():
    scales = [65536.0 / 2**i for i in range(8)]
    alerts = feed(Monitor(), [(i, {"amp/scale": s}, None) for i, s in enumerate(scales)])
    assert [(a.kind, a.step, a.confirmed_step) for a in alerts] == [("amp_overflow", 1, 5)]


def test_nonfinite_gradients_name_first_layer_once_the_loss_of_the_step_is_known():
    monitor = Monitor()
    grads = (3, {"grad/global_norm": math.nan}, [1.0, 1.0, math.nan, math.inf, 1.0, 1.0])
    assert feed(monitor, [grads]) == []  # held until the loss of step 3 arrives
    alerts = feed(monitor, [(3, {"loss": 0.7}, None)])
    assert alerts[0].kind == "nonfinite_gradients" and alerts[0].layer == "mid.weight"
    assert "starts" in alerts[0].message


def test_nonfinite_gradients_from_a_nonfinite_loss_say_the_loss_went_first():
    monitor = Monitor()
    stream = [
        (0, {"grad/global_norm": 1.0}, [1.0] * 6),
        (0, {"loss": 1.0}, None),
        (1, {"grad/global_norm": math.nan}, [math.nan] * 6),
        (1, {"loss": math.nan}, None),
    ]
    alerts = feed(monitor, stream)
    assert [a.kind for a in alerts] == ["nan_loss", "nonfinite_gradients"]
    assert "loss itself went non-finite first" in alerts[1].message and alerts[1].layer is None
    assert "starts" not in alerts[1].message
    # The loss already NaN at an earlier step: said at once.
    monitor = Monitor()
    alerts = feed(monitor, [(0, {"loss": math.inf}, None), (1, {"grad/global_norm": math.nan}, [math.nan] * 6)])
    assert [a.kind for a in alerts] == ["nan_loss", "nonfinite_gradients"] and "(at step 0)" in alerts[1].message


def test_a_held_alert_comes_out_at_the_next_step_or_on_flush():
    monitor = Monitor()
    assert feed(monitor, [(3, {"grad/global_norm": math.inf}, None)]) == []
    assert [a.step for a in monitor.flush()] == [3] and monitor.flush() == []
    monitor = Monitor()
    feed(monitor, [(3, {"grad/global_norm": math.inf}, None)])
    assert [a.step for a in feed(monitor, [(4, {"grad/global_norm": 1.0}, None)])] == [3]


def test_thresholds_can_be_overridden_and_bad_ones_fall_back_to_defaults():
    th = thresholds(
        {"exploding_gradients.ceiling": 10, "nonsense": 3, "loss_spike.window": "abc", "zero_gradients.patience": -4}
    )
    assert th["exploding_gradients.ceiling"] == 10.0 and "nonsense" not in th
    assert th["loss_spike.window"] == 100 and th["zero_gradients.patience"] == 20
    assert health.check_exploding_gradients({}, Observation(0, {"grad/global_norm": 11.0}), th)
    monitor = Monitor({"loss_spike.window": None})  # a damaged stored table never crashes the writer
    assert monitor.th["loss_spike.window"] == 100 and feed(monitor, losses([1.0] * 30)) == []
    assert health.DEFAULTS is __import__("gradwatch.thresholds").thresholds.DEFAULTS


def test_relevant_keys_are_the_ones_the_rules_read():
    assert all(
        health.relevant(k)
        for k in ("loss", "val/loss", "train/loss_kl", "grad/global_norm", "memory/cuda_reserved", "amp/scale")
    )
    assert Monitor.relevant("lr")  # the story of a blow-up at the start names the LR
    assert not any(Monitor.relevant(k) for k in ("accuracy", "memory/rss", "grad/missing_count"))


def test_every_rule_has_a_one_line_docstring():
    from gradwatch_server.health import registry

    rules = [r.check for r in registry.RULES]
    assert len(rules) >= 10
    core = [r for r in rules if r.__module__.rsplit(".", 1)[1] in ("loss", "grads", "layers", "system")]
    assert len(core) == 10 and core == [getattr(health, r.__name__) for r in core]  # the core ones exported here
    for rule in rules:
        assert rule.__doc__ and "\n" not in rule.__doc__.strip(), rule.__name__


# -- observe_batch: the same verdicts as observe, record by record ---------------------------------
import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1e4, 1e-9])
_VALUE = st.one_of(st.floats(0.01, 10.0), st.floats(0.5, 2.0), _SPECIAL)
_SLOT = st.one_of(st.none(), st.floats(1e-3, 10.0), _SPECIAL)


@st.composite
def streams(draw):
    """Random records: a loss or two, sometimes a global norm, a 6-slot grad vector, memory, AMP scale."""
    n = draw(st.integers(1, 120))
    value, slot = (_VALUE, _SLOT) if draw(st.booleans()) else (st.floats(0.5, 2.0), st.floats(0.5, 2.0))
    records = []
    step = 0
    for _ in range(n):
        step += draw(st.sampled_from([0, 1, 1, 1, 2]))
        scalars = {}
        for key, p in (
            ("loss", 0.7),
            ("val/loss", 0.15),
            ("grad/global_norm", 0.5),
            ("memory/cuda_reserved", 0.1),
            ("memory/cuda_total", 0.03),
            ("amp/scale", 0.1),
            ("lr", 0.2),
        ):
            if draw(st.floats(0, 1)) < p:
                scalars[key] = draw(value)
        norms = draw(st.lists(slot, min_size=6, max_size=6)) if draw(st.booleans()) else None
        records.append((step, scalars, norms))
    return records


def _batched(
    records,
    keys=("loss", "val/loss", "grad/global_norm", "memory/cuda_reserved", "memory/cuda_total", "amp/scale", "lr"),
):
    steps = np.array([r[0] for r in records], dtype=np.int64)
    scalars = {}
    for key in keys:
        rows = [i for i, r in enumerate(records) if key in r[1]]
        if rows:
            scalars[key] = (np.array(rows), np.array([records[i][1][key] for i in rows], dtype=np.float64))
    vectors = {}
    rows = [i for i, r in enumerate(records) if r[2] is not None]
    if rows:
        vals = np.array([[math.nan if v is None else v for v in records[i][2]] for i in rows], dtype=np.float64)
        present = np.array([[v is not None for v in records[i][2]] for i in rows], dtype=bool)
        vectors["grad"] = (LAYERS, np.array(rows), vals, present)
    return steps, scalars, vectors


def _ordered(
    record,
    keys=("loss", "val/loss", "grad/global_norm", "memory/cuda_reserved", "memory/cuda_total", "amp/scale", "lr"),
):
    step, scalars, norms = record
    return step, {k: scalars[k] for k in keys if k in scalars}, norms


def _same(a, b):
    return [(x.kind, x.step, x.confirmed_step, x.key, x.layer, x.message, repr(x.value)) for x in a] == [
        (x.kind, x.step, x.confirmed_step, x.key, x.layer, x.message, repr(x.value)) for x in b
    ]


@settings(max_examples=80, deadline=None)
@given(
    warmup=streams(),
    records=streams(),
    cut=st.integers(0, 120),
    th=st.sampled_from(
        [
            {},
            {
                "loss_spike.min_history": 3,
                "loss_spike.window": 7,
                "exploding_gradients.min_history": 2,
                "exploding_gradients.window": 4,
                "missing_gradients.patience": 2,
                "zero_gradients.patience": 2,
                "vanishing_gradients.patience": 2,
                "nan_loss.cooldown": 2,
                "loss_divergence.cooldown": 3,
            },
        ]
    ),
)
def test_observe_batch_equals_observe_record_by_record(warmup, records, cut, th):
    meta = {"cuda_total_memory": 8.0}
    one, many = Monitor(th, meta), Monitor(th, meta)
    expected = [
        a
        for r in warmup + records
        for a in one.observe(*_ordered(r)[:2], {"grad": (LAYERS, r[2])} if r[2] is not None else {})
    ]
    got = many.observe_batch(*_batched(warmup))
    cut = min(cut, len(records))
    for part in (records[:cut], records[cut:]):
        if part:
            got += many.observe_batch(*_batched(part))
    assert _same(got, expected)
    assert _same(one.flush(), many.flush())


def test_observe_batch_fast_path_on_long_healthy_streams():
    rng = random.Random(1)
    records = [
        (
            i,
            {"loss": 2.0 * math.exp(-i / 300) + 0.05 * rng.random(), "grad/global_norm": 1 + rng.random()},
            [0.1 + rng.random() for _ in range(6)],
        )
        for i in range(1500)
    ]
    records[900] = (900, {"loss": 15.0, "grad/global_norm": 1.5}, [1.0] * 6)  # one bad batch in the middle
    one, many = Monitor(), Monitor()
    expected = [a for r in records for a in one.observe(*_ordered(r)[:2], {"grad": (LAYERS, r[2])})]
    got = []
    for start in range(0, len(records), 256):
        got += many.observe_batch(*_batched(records[start : start + 256]))
    assert [(a.kind, a.step) for a in expected] == [("loss_spike", 900)] and _same(got, expected)


def test_observe_batch_cost_of_a_healthy_loss_batch():
    import time

    rng = np.random.default_rng(0)
    monitor = Monitor()
    best = math.inf
    for b in range(30):
        steps = np.arange(b * 2000, (b + 1) * 2000)
        loss = 2.0 * np.exp(-steps / 5000) * (1 + 0.01 * rng.standard_normal(2000))  # learning: no plateau
        t = time.perf_counter()
        assert monitor.observe_batch(steps, {"loss": (np.arange(2000), loss)}, {}) == []
        best = min(best, time.perf_counter() - t)
    assert best < 0.01, f"{best * 1e3:.2f} ms for 2000 records (target 2 ms; 10 ms leaves room for a busy machine)"


def _one_by_one(records, sizes):
    """``observe`` record by record and ``observe_batch`` on batches of the given sizes (cycled): both alert lists."""
    one, many = Monitor({}, {"cuda_total_memory": 8.0}), Monitor({}, {"cuda_total_memory": 8.0})
    expected = []
    for r in records:
        layout = r[3] if len(r) > 3 else LAYERS
        expected += one.observe(*_ordered(r[:3])[:2], {"grad": (layout, r[2])} if r[2] is not None else {})
    got, start, i = [], 0, 0
    while start < len(records):
        part = records[start : start + sizes[i % len(sizes)]]
        own = [j for j, r in enumerate(part) if len(r) > 3]  # a record under its own layout: a batch of its own
        part = part[: max(1, own[0])] if own else part
        steps, scalars, vectors = _batched([r[:3] for r in part])
        if "grad" in vectors and len(part[0]) > 3:
            vectors["grad"] = (part[0][3], *vectors["grad"][1:])
        got += many.observe_batch(steps, scalars, vectors)
        start, i = start + len(part), i + 1
    return expected, got, one.flush(), many.flush()


def test_one_and_few_step_batches_equal_observe():
    """Live runs send a step per batch: the small-batch path (no bulk checks) says what ``observe`` says."""
    rng = random.Random(3)
    records = []
    for i in range(400):
        scalars = {"loss": 2.0 * math.exp(-i / 200) + 0.05 * rng.random(), "grad/global_norm": 1 + rng.random()}
        norms = [0.1 + rng.random() for _ in range(6)]
        if 120 <= i < 126:  # exploding gradients, the layers too
            scalars["grad/global_norm"], norms = 5e4, [1e4] * 6
        if i == 200:
            scalars["loss"] = math.nan
        if i == 201:
            scalars["loss"], scalars["grad/global_norm"], norms[2] = math.inf, math.inf, math.inf
        if 250 <= i < 300:  # a layer whose .grad is None
            norms[4] = None
        if i % 7 == 0:
            norms = None  # a record without the vector
        records.append((i, scalars, norms))
    records.append((400, {"loss": 0.5}, [1.0, 2.0, 3.0, 4.0], LAYERS))  # a layout that does not fit: param[i]
    records.append((401, {"loss": 0.5, "val/loss": math.nan}, None))
    records.append((402, {"loss": 0.4}, None))
    records.append((403, {"grad/global_norm": math.nan}, [1.0, math.nan, None, 1.0, 1.0, 1.0]))  # held to flush
    for sizes in ([1], [2], [3, 1, 4], [1, 5, 1, 64]):  # one-step, few-step, and past the threshold
        expected, got, held_one, held_many = _one_by_one(records, sizes)
        kinds = {a.kind for a in expected}
        assert {"nan_loss", "exploding_gradients", "missing_gradients", "nonfinite_gradients"} <= kinds, kinds
        assert _same(got, expected), sizes
        assert [a.kind for a in held_one] == ["nonfinite_gradients"] and _same(held_one, held_many)


@settings(max_examples=60, deadline=None)
@given(records=streams(), sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5))
def test_small_batches_equal_observe_on_random_streams(records, sizes):
    expected, got, held_one, held_many = _one_by_one(records, sizes)
    assert _same(got, expected)
    assert _same(held_one, held_many)
