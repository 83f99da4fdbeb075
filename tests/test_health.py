"""Health rules as pure functions over streams (no server, no torch)."""

from __future__ import annotations

import math

from gradwatch_server import health
from gradwatch_server.health import Monitor, Observation, thresholds

TH = thresholds()
LAYERS = ["in.weight", "in.bias", "mid.weight", "mid.bias", "out.weight", "out.bias"]


def feed(monitor: Monitor, steps):
    alerts = []
    for step, scalars, norms in steps:
        alerts += monitor.observe(step, scalars, {"grad": (LAYERS, norms)} if norms is not None else {})
    return alerts


def test_nan_loss_fires_once_per_episode_at_exact_step():
    stream = [(i, {"loss": v}, None) for i, v in enumerate([1.0, 0.9, math.nan, math.nan, math.inf, 0.5, -math.inf])]
    alerts = feed(Monitor(), stream)
    assert [(a.kind, a.step) for a in alerts] == [("nan_loss", 2), ("nan_loss", 6)]
    assert "NaN" in alerts[0].message and "-inf" in alerts[1].message


def test_exploding_relative_to_own_history_and_absolute_ceiling():
    steady = [(i, {"grad/global_norm": 1.0 + 0.1 * (i % 3)}, [1.0] * 6) for i in range(30)]
    alerts = feed(Monitor(), steady + [(30, {"grad/global_norm": 500.0}, [1, 1, 1, 1, 1, 500.0])])
    assert [a.kind for a in alerts] == ["exploding_gradients"]
    assert alerts[0].layer == "out.bias" and alerts[0].step == 30
    assert feed(Monitor(), [(0, {"grad/global_norm": 5000.0}, None)])[0].kind == "exploding_gradients"


def test_one_alert_per_exploding_episode():
    stream = [(i, {"grad/global_norm": 1.0}, None) for i in range(20)]
    stream += [(20 + i, {"grad/global_norm": 1e4}, None) for i in range(10)]
    assert len(feed(Monitor(), stream)) == 1


def test_tiny_gradients_of_a_converged_run_are_not_vanishing():
    stream = [(i, {"grad/global_norm": 1e-9}, [1e-9] * 6) for i in range(100)]
    assert feed(Monitor(), stream) == []


def test_vanishing_needs_early_layers_far_below_late_ones_for_a_while():
    norms = [1e-8, 1e-8, 1e-5, 1e-5, 1e-1, 1e-1]
    alerts = feed(Monitor(), [(i, {"grad/global_norm": 0.14}, norms) for i in range(25)])
    assert [(a.kind, a.step, a.layer) for a in alerts] == [("vanishing_gradients", 19, "in.weight")]


def test_zero_and_missing_gradients_name_the_parameters():
    norms = [0.0, 0.0, None, None, 1.0, 1.0]
    alerts = feed(Monitor(), [(i, {"grad/global_norm": 1.4}, norms) for i in range(25)])
    kinds = {a.kind: a for a in alerts}
    assert set(kinds) == {"zero_gradients", "missing_gradients"}
    assert kinds["missing_gradients"].step == 4 and "mid" in kinds["missing_gradients"].message
    assert kinds["zero_gradients"].step == 19 and kinds["zero_gradients"].layer == "in.weight"


def test_global_norm_exactly_zero_says_graph_is_disconnected():
    alerts = feed(Monitor(), [(i, {"grad/global_norm": 0.0}, [0.0] * 6) for i in range(20)])
    assert alerts[0].kind == "zero_gradients" and alerts[0].severity == "critical"
    assert "not connected" in alerts[0].message


def test_loss_spike_against_robust_spread_but_not_on_noise():
    noisy = [(i, {"loss": 1.0 + 0.05 * math.sin(i)}, None) for i in range(60)]
    assert feed(Monitor(), noisy) == []
    alerts = feed(Monitor(), noisy + [(60, {"loss": 8.0}, None), (61, {"loss": 9.0}, None)])
    assert [(a.kind, a.step) for a in alerts] == [("loss_spike", 60)]


def test_memory_pressure_uses_device_capacity():
    monitor = Monitor(meta={"cuda_total_memory": 80 * 2**30})
    alerts = feed(monitor, [(0, {"memory/cuda_reserved": 50.0 * 2**30}, None),
                            (1, {"memory/cuda_reserved": 79.0 * 2**30}, None)])
    assert [(a.kind, a.step) for a in alerts] == [("memory_pressure", 1)]


def test_amp_overflow_counts_scale_drops():
    scales = [65536.0 / 2**i for i in range(8)]
    alerts = feed(Monitor(), [(i, {"amp/scale": s}, None) for i, s in enumerate(scales)])
    assert [(a.kind, a.step) for a in alerts] == [("amp_overflow", 5)]


def test_nonfinite_gradients_name_first_layer():
    alerts = feed(Monitor(), [(3, {"grad/global_norm": math.nan}, [1.0, 1.0, math.nan, math.inf, 1.0, 1.0])])
    assert alerts[0].kind == "nonfinite_gradients" and alerts[0].layer == "mid.weight"


def test_thresholds_can_be_overridden_and_unknown_names_ignored():
    th = thresholds({"exploding_gradients.ceiling": 10, "nonsense": 3})
    assert th["exploding_gradients.ceiling"] == 10.0 and "nonsense" not in th
    assert health.check_exploding_gradients({}, Observation(0, {"grad/global_norm": 11.0}), th)


def test_every_rule_has_a_one_line_docstring():
    rules = [getattr(health, n) for n in dir(health) if n.startswith("check_")]
    assert len(rules) == 9
    for rule in rules:
        assert rule.__doc__ and "\n" not in rule.__doc__.strip(), rule.__name__
