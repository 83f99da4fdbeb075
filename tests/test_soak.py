"""A short soak in CI (the long one is benchmarks/soak.py): several training processes, two watchers,
the server SIGKILLed and restarted mid-run; every point stored exactly once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from soak import soak  # noqa: E402

pytestmark = pytest.mark.slow


def test_processes_survive_a_server_crash_with_every_point_once():
    out = soak(clients=5, seconds=10, rate=40)
    assert out["exactly_once"], out
    assert out["points"] >= 5 * 4 * 300  # the clients really logged through the outage
    assert out["pushes"].get("list", 0) > 0 and out["pushes"].get("run page", 0) > 0
    assert max(m for _, m in out["memory"]) < 400  # MiB: nothing grows without bound in 10 s
