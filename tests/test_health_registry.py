"""The rule registry: every registered rule runs on ingest, and the kinds, thresholds and docs derive from it."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from gradwatch import thresholds as gw_thresholds
from gradwatch_server.health import registry
from gradwatch_server.health.common import Alert, Observation, episode
from gradwatch_server.health.monitor import Monitor
from gradwatch_server.health.rule import Columns, Rule

DOC = Path(__file__).resolve().parent.parent / "docs" / "alerts.md"
TABLES = {"rules-table": registry.rules_table, "thresholds-table": registry.thresholds_table}
PROBE_KEY = "probe/value"


# -- a throwaway rule, registered through the public API -----------------------------------------------
def check_probe(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """A probe value above 5 (a rule that exists only in this test)."""
    value = obs.scalars.get(PROBE_KEY)
    state["seen"] = state.get("seen", 0) + (value is not None)
    if value is None or not episode(state, value > 5, 3):
        return []
    return [Alert("registry_probe", obs.step, value, "warning", key=PROBE_KEY, message=f"probe {value}")]


def bulk_probe(state: dict, cols: Columns) -> bool:
    """Nothing above 5: count the values at once."""
    state["bulk_calls"] = state.get("bulk_calls", 0) + 1
    probe = cols.scalars.get(PROBE_KEY)
    if probe is not None and (probe[1] > 5).any():
        return False
    state["seen"] = state.get("seen", 0) + (0 if probe is None else len(probe[1]))
    return True


@pytest.fixture
def probe():
    rule = registry.register(Rule("probe", "registry_probe", check_probe, bulk_probe, reads=frozenset({PROBE_KEY})))
    try:
        yield rule
    finally:
        registry.unregister("probe")


def _batch(values, start=0):
    steps = np.arange(start, start + len(values))
    return steps, {PROBE_KEY: (np.arange(len(values)), np.array(values, dtype=np.float64))}, {}


def test_a_registered_rule_runs_on_observe_batch_and_observe(probe):
    monitor = Monitor()
    healthy = [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0]  # past the small-batch path (health/batch.SMALL_BATCH)
    assert monitor.observe_batch(*_batch(healthy)) == []  # healthy: the bulk check took it
    assert monitor.states["probe"] == {"bulk_calls": 1, "seen": 8}
    alerts = monitor.observe_batch(*_batch([1.0, 9.0, 9.5, 1.0, 1.0, 1.0, 1.0, 1.0], start=8))  # record by record
    assert [(a.kind, a.step, a.value) for a in alerts] == [("registry_probe", 9, 9.0)]
    assert monitor.states["probe"]["seen"] == 16
    assert monitor.observe_batch(*_batch([2.0], start=16)) == []  # a one-step batch: every rule, record by record
    assert (monitor.states["probe"]["bulk_calls"], monitor.states["probe"]["seen"]) == (2, 17)  # no bulk call
    assert [a.step for a in monitor.observe(10, {PROBE_KEY: 1.0}, {})] == []
    assert registry.relevant(PROBE_KEY) and "registry_probe" in registry.kinds()


def test_a_registered_rule_runs_on_ingest(probe, tmp_path):
    from gradwatch_server.ingest.apply import apply_batch, load_state
    from gradwatch_server.ingest.batch import decode
    from gradwatch_server.ingest.hello import open_run
    from gradwatch_server.storage import database

    engine = database.make_engine(f"sqlite:///{tmp_path / 'probe.db'}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "u1", "project": "p", "name": "n"}, {})["run_id"]
    records = [{"step": s, "t": 1000.0 + s, "scalars": {PROBE_KEY: float(s)}} for s in range(8)]
    with engine.begin() as conn:
        state = load_state(conn, run_id)
        out = apply_batch(conn, state, decode({"type": "batch", "seq": 1, "records": records}))
    assert [(a["kind"], a["step"]) for a in out["alerts"]] == [("registry_probe", 6)]


def test_the_registry_forgets_an_unregistered_rule(probe):
    registry.unregister("probe")
    try:
        assert not registry.relevant(PROBE_KEY) and "registry_probe" not in registry.kinds()
        assert Monitor().observe_batch(*_batch([9.0])) == []
    finally:
        registry.register(probe)  # the fixture unregisters it again


def test_register_refuses_a_clash_or_a_non_rule():
    nan = registry.RULES[0]
    with pytest.raises(ValueError, match="clashes"):
        registry.register(dataclasses.replace(nan, name="other"))
    with pytest.raises(ValueError, match="clashes"):
        registry.register(dataclasses.replace(nan, kind="other"))
    with pytest.raises(TypeError):
        registry.register(("nan", "nan_loss"))
    with pytest.raises(KeyError):
        registry.unregister("no such rule")


# -- every rule's checks are called ------------------------------------------------------------------
def _spied(monkeypatch, verdict):
    """Every registered rule with counting wrappers around its checks; the bulk check says ``verdict``."""
    calls = {r.name: {"bulk": 0, "check": 0} for r in registry.RULES}

    def wrap(rule):
        def bulk(state, cols):
            calls[rule.name]["bulk"] += 1
            return rule.bulk(state, cols) and verdict

        def check(state, obs, th):
            calls[rule.name]["check"] += 1
            return rule.check(state, obs, th)

        return dataclasses.replace(rule, bulk=bulk, check=check)

    monkeypatch.setattr(registry, "RULES", tuple(wrap(r) for r in registry.RULES))
    return calls


VALUES = {"grad/global_norm": 1.0, "memory/cuda_reserved": 1.0, "memory/cuda_total": 8.0, "amp/scale": 1024.0}
VALUES.update(  # the early-warning rule's (layer signals: the largest update ratio and output RMS, and where)
    {f"signals/{k}": 0.0 for k in ("update_ratio_max", "update_ratio_argmax", "act_rms_max", "act_rms_argmax")}
)
VALUES.update({"perf/step_time": 0.1, "perf/data_wait": 0.01})  # the throughput rule's
VALUES["grad/global_norm_clipped"] = 1.0  # the zero-gradients rule reads what reached the weights


def _full_batch(n=6, keys=VALUES):
    """n healthy records: a falling loss, the scalars ``keys`` (rules read them) and a 4-layer grad vector."""
    every = np.arange(n)
    scalars = {key: (every, np.full(n, VALUES[key])) for key in keys}
    scalars["loss"] = (every, np.linspace(1.0, 0.5, n))
    layout = ["a.weight", "b.weight", "c.weight", "d.weight"]
    vectors = {"grad": (layout, every, np.ones((n, 4)), np.ones((n, 4), dtype=bool))}
    return every, scalars, vectors


def test_observe_batch_calls_every_rules_bulk_check(monkeypatch):
    calls = _spied(monkeypatch, verdict=True)
    # Without the two keys whose rules always go record by record (a capacity update, an AMP scale).
    batch = _full_batch(keys=("grad/global_norm", "memory/cuda_reserved"))
    assert Monitor(meta={"cuda_total_memory": 8.0}).observe_batch(*batch) == []
    assert {name: c["bulk"] for name, c in calls.items()} == {r.name: 1 for r in registry.RULES}
    assert not any(c["check"] for c in calls.values())


def test_a_rule_whose_bulk_check_says_no_sees_every_record(monkeypatch):
    calls = _spied(monkeypatch, verdict=False)
    assert set(VALUES) == registry.reads()  # every key a rule reads is in the batch
    assert Monitor().observe_batch(*_full_batch(6)) == []
    assert {name: c["check"] for name, c in calls.items()} == {r.name: 6 for r in registry.RULES}


# -- what derives from the registry -------------------------------------------------------------------
def test_rules_are_complete_and_documented_in_their_docstrings():
    assert len(registry.RULES) == 13 and len({r.name for r in registry.RULES}) == 13
    for rule in registry.RULES:
        assert rule.check.__doc__ and "\n" not in rule.check.__doc__.strip(), rule.name
        assert rule.bulk.__doc__ and callable(rule.bulk), rule.name
        assert rule.thresholds, f"{rule.kind} has no thresholds in gradwatch.thresholds"


def test_every_rule_spec_is_bound_to_a_rule():
    from gradwatch import contract

    assert registry.kinds() == contract.rules.kinds() == contract.RULE_KINDS  # one rule per spec, in order
    assert all(rule.spec is contract.rules.spec(rule.kind) for rule in registry.RULES)
    assert contract.ALERT_KINDS[: len(registry.RULES)] == registry.kinds()
    owned = [name for rule in registry.RULES for name in rule.thresholds]
    assert sorted(owned) == sorted(gw_thresholds.DEFAULTS)


def test_a_rule_registered_at_run_time_brings_its_spec_everywhere():
    from gradwatch import contract

    spec = contract.RuleSpec("probe_kind", "info", "A probe.", (contract.rules.Threshold("patience", 3),))
    rule = registry.register(Rule("probe2", "probe_kind", check_probe, bulk_probe, own_spec=spec))
    try:
        assert gw_thresholds.DEFAULTS["probe_kind.patience"] == 3 and gw_thresholds.check("probe_kind.patience", 4) == 4
        assert rule.thresholds == {"probe_kind.patience": 3} and rule.severity == "info"
        assert (
            '"probe_kind.patience": 3' in contract.es_module()
            and "probe_kind" in contract.shared_constants()["ALERT_KINDS"]
        )
    finally:
        registry.unregister("probe2")
    assert "probe_kind.patience" not in gw_thresholds.DEFAULTS and contract.rules.spec("probe_kind") is None


def test_the_keys_the_rules_read_are_the_relevant_ones():
    assert all(registry.relevant(k) for k in ("loss", "val/loss", *registry.reads()))
    assert not any(registry.relevant(k) for k in ("lr", "accuracy", "memory/rss"))


def test_the_storage_keeps_nonfinite_values_of_the_rules_that_declare_them():
    from gradwatch_server.storage import store

    kept = {k for k in (*registry.kinds(), "data_gap") if store.keeps_nonfinite(k)}
    assert kept == set(registry.nonfinite_kinds()) == {"nan_loss", "nonfinite_gradients"}
    assert registry.smaller_is_worse("vanishing_gradients") and not registry.smaller_is_worse("exploding_gradients")
    assert not registry.smaller_is_worse("data_gap")


def _block(text: str, marker: str) -> re.Match:
    """The table between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` (group 1)."""
    return re.search(rf"<!-- {marker}:start -->\n(.*?)\n<!-- {marker}:end -->", text, re.S)


def _documented(text: str, marker: str) -> str:
    return _block(text, marker).group(1)


@pytest.mark.parametrize("marker", list(TABLES))
def test_docs_tables_are_in_step_with_the_registry(marker):
    assert _documented(DOC.read_text(), marker) == TABLES[marker](), "run: python tests/test_health_registry.py"


if __name__ == "__main__":  # regenerate the tables in docs/alerts.md
    text = DOC.read_text()
    for marker, table in TABLES.items():
        found = _block(text, marker)
        text = text[: found.start(1)] + table() + text[found.end(1) :]
    DOC.write_text(text)
    sys.stdout.write("docs/alerts.md: tables regenerated\n")
