"""Threshold validation shared by init(alerts=...) and the server."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from gradwatch import thresholds


def test_valid_overrides_become_floats_numpy_scalars_included():
    got = thresholds.validate(
        {
            "exploding_gradients.ceiling": np.float32(500),
            "loss_spike.window": np.int64(50),
            "missing_gradients.patience": 3,
        }
    )
    assert got == {"exploding_gradients.ceiling": 500.0, "loss_spike.window": 50.0, "missing_gradients.patience": 3.0}
    assert all(type(v) is float for v in got.values())
    assert thresholds.validate(None) == {} and thresholds.validate({}) == {}


def test_unknown_name_suggests_the_close_one():
    with pytest.raises(
        ValueError,
        match=r"unknown alert threshold 'exploding_gradient.ceiling'.*"
        r"Did you mean 'exploding_gradients.ceiling'",
    ):
        thresholds.validate({"exploding_gradient.ceiling": 10})


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("loss_spike.window", "100", "must be a number"),
        ("loss_spike.window", None, "must be a number"),
        ("loss_spike.window", True, "must be a number"),
        ("loss_spike.window", [1], "must be a number"),
        ("loss_spike.factor", float("nan"), "NaN"),
        ("loss_spike.window", 0, "must be >= 1"),
        ("zero_gradients.patience", -3, "must be >= 1"),
        ("loss_spike.window", 2.5, "whole number"),
        ("vanishing_gradients.ratio", 2.0, "<= 1"),
        ("memory_pressure.fraction", 0, "> 0"),
        ("exploding_gradients.ceiling", -1, "> 0"),
        ("loss_divergence.factor", 0.5, "> 1"),
    ],
)
def test_bad_values_say_what_is_wrong(name, value, words):
    with pytest.raises(ValueError, match=words) as info:
        thresholds.validate({name: value})
    assert name in str(info.value)


def test_not_a_mapping():
    with pytest.raises(ValueError, match="dict"):
        thresholds.validate([("loss_spike.window", 3)])


def test_merged_never_raises_and_keeps_defaults_for_bad_entries():
    th = thresholds.merged({"loss_spike.window": "x", "bogus": 1, "nan_loss.cooldown": 3})
    assert th["loss_spike.window"] == 100 and th["nan_loss.cooldown"] == 3.0 and "bogus" not in th
    assert thresholds.merged("not a dict") == thresholds.merged(None)
    assert set(thresholds.merged(None)) == set(thresholds.DEFAULTS)


def test_of_a_kind_is_its_prefix_of_the_defaults():
    assert thresholds.of("amp_overflow") == {"amp_overflow.skips": 5, "amp_overflow.window": 100}
    assert thresholds.of("loss") == {} and thresholds.of("no_such_kind") == {}  # whole names only, not a prefix


def test_every_default_passes_its_own_validation():
    assert thresholds.validate(thresholds.DEFAULTS) == {k: float(v) for k, v in thresholds.DEFAULTS.items()}


def test_module_imports_neither_torch_nor_numpy():
    code = "import sys, gradwatch.thresholds; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
