"""A project's rules through a real server: validated, stored with who changed what, applied to a running run
from its next batch (its own init(alerts=...) still wins), and replayed on history before saving."""

from __future__ import annotations

import math
import time

import numpy as np
from waiting import wait_until

import gradwatch
from gradwatch_server.ingest.apply import load_state
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.rules import policy
from gradwatch_server.storage import database


def _wait(fn, timeout=15.0):
    return wait_until(fn, timeout=timeout, interval=0.05)


def test_rules_are_validated_stored_and_logged(server, api):
    got = api.get("/api/projects/p/rules")
    assert got["disabled"] == [] and got["custom"] == [] and got["updated_at"] is None
    assert got["defaults"]["loss_spike.factor"] == 10.0 and "loss_spike" in got["kinds"]
    for bad in (
        {"thresholds": {"loss_spike.factr": 3}},
        {"thresholds": {"loss_spike.factor": -1}},
        {"disabled": ["no_such_rule"]},
        {"severity": {"loss_spike": "loud"}},
        {"custom": [{"name": "x", "key": "acc", "type": "median"}]},
        {"custom": [{"name": "x", "key": "acc", "type": "n_of_m", "value": 1, "n": 5, "m": 3}]},
        {"custom": [{"name": "x", "key": "acc", "type": "threshold"}]},
        {"surprise": 1},
    ):
        status, body = api.request("PUT", "/api/projects/p/rules", bad)
        assert status == 400, (bad, body)
    doc = {
        "by": "ana",
        "disabled": ["loss_spike"],
        "thresholds": {"exploding_gradients.factor": 50},
        "severity": {"loss_divergence": "warning"},
        "custom": [{"name": "acc low", "key": "acc", "type": "threshold", "op": "<", "value": 0.5}],
    }
    status, body = api.request("PUT", "/api/projects/p/rules", doc)
    assert status == 200, body
    assert body["updated_by"] == "anonymous" and body["disabled"] == ["loss_spike"]  # the token's name, not "by"
    lines = body["history"][0]["changes"]
    assert "loss_spike: off" in lines and "thresholds.exploding_gradients.factor: default -> 50.0" in lines
    assert body["history"][0]["by"] == "anonymous" and body["custom"][0]["window"] == 50


def test_a_running_run_applies_new_rules_from_its_next_batch(server, api):
    run = gradwatch.init(project="live", name="r", server=server.url)
    for step in range(20):
        run.log({"loss": 1.0 / (step + 1), "acc": 0.3}, step=step)
    run.flush() if hasattr(run, "flush") else time.sleep(1.0)
    _wait(lambda: api.get("/api/runs/1")["last_step"] == 19)
    assert api.get("/api/runs/1/alerts") == []  # no rule on acc yet
    rule = {"name": "acc low", "key": "acc", "type": "n_of_m", "op": "<", "value": 0.5, "n": 3, "m": 5}
    assert api.request("PUT", "/api/projects/live/rules", {"custom": [rule], "by": "bo"})[0] == 200
    for step in range(20, 30):
        run.log({"loss": 0.05, "acc": 0.3}, step=step)
    run.finish()
    alerts = _wait(lambda: [a for a in api.get("/api/runs/1/alerts") if a["kind"] == "custom_rule"])
    assert alerts[0]["layer"] == "acc low" and alerts[0]["key"] == "acc" and alerts[0]["step"] == 22
    assert "acc low" in alerts[0]["message"]


def test_the_runs_own_thresholds_win_over_the_projects(tmp_path):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'rules.db'}")
    with engine.begin() as conn:
        info = {"uid": "u1", "project": "p", "name": "n", "alerts": {"loss_spike.factor": 50}}
        run_id = open_run(conn, info, {})["run_id"]
        doc = policy.validate(
            {"thresholds": {"loss_spike.factor": 5, "loss_divergence.factor": 4}, "disabled": ["nan_loss"]}
        )
        policy.save(conn, "p", doc, "ana")
        monitor = load_state(conn, run_id).monitor
    assert monitor.th["loss_spike.factor"] == 50  # init(alerts=...) wins
    assert monitor.th["loss_divergence.factor"] == 4  # the project's where the run said nothing
    assert monitor.observe_batch(np.arange(3), {"loss": (np.arange(3), np.array([1.0, math.nan, 1.0]))}, {}) == []


def test_backtest_shows_where_proposed_rules_fire_next_to_current(server, api):
    run = gradwatch.init(project="bt", name="diverges", server=server.url)
    for step in range(200):
        run.log({"loss": 1.0 if step < 150 else 500.0, "acc": 0.9 if step < 100 else 0.2}, step=step)
    run.finish()
    healthy = gradwatch.init(project="bt", name="fine", server=server.url)
    for step in range(200):
        healthy.log({"loss": 1.0 / (1 + step), "acc": 0.9}, step=step)
    healthy.finish()
    proposed = {
        "disabled": ["loss_divergence"],
        "custom": [{"name": "acc drop", "key": "acc", "type": "relative", "op": "<", "factor": 0.5}],
    }
    status, out = api.request("POST", "/api/projects/bt/rules/backtest", proposed)
    assert status == 200, out
    by = {r["name"]: r for r in out["runs"]}
    cur = [(a["kind"], a["step"]) for a in by["diverges"]["current"]]
    new = [(a["kind"], a["step"], a["layer"]) for a in by["diverges"]["proposed"]]
    assert ("loss_divergence", 150) in cur and not any(k == "loss_divergence" for k, _, _ in new)
    assert ("custom_rule", 100, "acc drop") in new
    assert by["fine"]["current"] == [] and by["fine"]["proposed"] == []
    assert out["seconds"] < 2 and not math.isnan(out["points"])
    assert api.get("/api/projects/bt/rules")["updated_at"] is None  # a replay saves nothing


# --- the replay's loss rules, whole series at a time, against the Monitor's batches (what it did before) -----
def _old_replay(steps, cols, doc, run_alerts, kinds):
    """The replay as it was: every replayed kind through one Monitor, ``observe_batch`` in batches."""
    from gradwatch_server.health import monitor as health
    from gradwatch_server.health import registry
    from gradwatch_server.rules.backtest import BATCH, FIRST

    off = sorted(set(registry.kinds()) - (kinds - set(doc["disabled"])))
    pol = policy.Policy({**{k: doc[k] for k in policy.EMPTY}, "disabled": off})
    monitor = health.Monitor(health.thresholds({**doc["thresholds"], **run_alerts}), policy=pol)
    fired, lo = [], 0
    while lo < len(steps):
        hi = min(lo + (FIRST if lo == 0 else BATCH), len(steps))
        part = {}
        for key, (rows, values) in cols.items():
            a, b = np.searchsorted(rows, [lo, hi])
            if b > a:
                part[key] = (rows[a:b] - lo, values[a:b])
        fired += monitor.observe_batch(steps[lo:hi], part, {})
        lo = hi
    fields = ("kind", "step", "value", "key", "layer", "severity")
    return [{f: getattr(a, f) for f in fields} for a in fired + pol.apply(monitor.flush())]


def _corpus_run(seed: int, n: int):
    """A run like the corpus's: a decaying noisy loss with bad batches, runs of spikes that come back, a
    divergence, NaN stretches, a loss that starts at 0; a validation loss now and then; a gradient norm."""
    rng = np.random.default_rng(seed)
    s = np.arange(n)
    loss = (2.0 * np.exp(-s / (n / 3)) + 0.1) * (1 + 0.03 * rng.standard_normal(n))
    for at in rng.integers(0, n, 6):
        loss[at : at + rng.integers(1, 40)] *= rng.choice([3.0, 40.0, 0.01])  # spikes, runs of them, dips
    if seed % 3 == 0:
        loss[int(n * 0.7) :] *= 100  # diverged for good
    if seed % 3 == 1:
        loss[int(n * 0.4) : int(n * 0.45)] *= 50  # diverged, then came back
    if seed % 4 == 0:
        loss[:5] = 0.0
    for at in rng.integers(0, n, 2):
        loss[at : at + rng.integers(1, 15)] = rng.choice([np.nan, np.inf])
    if seed % 5 == 0:
        loss = 1e-7 * (1 + 0.3 * rng.standard_normal(n))  # converged: floors matter
    val_rows = s[::50]
    cols = {
        "loss": (s, loss),
        "grad/global_norm": (s, np.abs(1 + 0.2 * rng.standard_normal(n)) * np.where(s > n * 0.9, 500, 1)),
        "val/loss": (val_rows, loss[val_rows] * 1.1),
    }
    return s.astype(np.int64), cols


def test_the_replay_fires_exactly_as_the_monitor_did():
    from gradwatch_server.rules import backtest

    docs = [
        {"thresholds": {"loss_spike.factor": 8, "loss_divergence.factor": 5}},
        {"thresholds": {"loss_spike.window": 30, "loss_spike.min_history": 5, "loss_spike.cooldown": 1}},
        {"thresholds": {"loss_divergence.window": 5, "loss_divergence.cooldown": 3, "nan_loss.cooldown": 1}},
        {"thresholds": {"loss_spike.factor": 4, "loss_spike.min_delta": 0}, "severity": {"loss_spike": "critical"}},
        {"disabled": ["nan_loss"], "thresholds": {"exploding_gradients.factor": 50}},
        {
            "thresholds": {"loss_spike.factor": 8},
            "custom": [{"name": "z", "key": "val/loss", "type": "zscore", "z": 3}],
        },
    ]
    compared = fired = 0
    for seed in range(24):
        steps, cols = _corpus_run(seed, 3000 if seed % 2 else 1200)
        for raw in docs:
            doc = policy.validate(raw)
            kinds = backtest.affected(policy.validate({}), doc) | {"nan_loss", "loss_spike", "loss_divergence"}
            own = {"loss_spike.factor": 6} if seed % 7 == 0 else {}
            by_step = lambda out: sorted(  # noqa: E731 - as backtest sorts them
                [{**a, "value": gradwatch.contract.encode_float(a["value"])} for a in out], key=lambda a: a["step"]
            )
            old = by_step(_old_replay(steps, cols, doc, own, kinds))
            assert by_step(backtest.replay(steps, cols, doc, own, kinds)) == old, (seed, raw)
            compared, fired = compared + 1, fired + len(old)
    assert compared == 144 and fired > 500  # the corpus does fire: the comparison is not of empty lists


# --- issue #30: custom rules cost O(batch + window), a budget per project, GET's answer accepted back ------


def _direct_bad(spec: dict, values: np.ndarray) -> np.ndarray:
    """The definition, value by value: what the rule means (the window before each value, NaN left out)."""
    out = np.zeros(len(values), dtype=bool)
    for i, v in enumerate(values):
        if spec["type"] == "n_of_m":  # counted over the last m steps, this one included (NaN never counts)
            last = values[max(0, i - spec["m"] + 1) : i + 1]
            flags = np.isfinite(last) & ((last > spec["value"]) if spec["op"] == ">" else (last < spec["value"]))
            out[i] = flags.sum() >= spec["n"]
            continue
        before = values[max(0, i - spec["window"]) : i]
        if not np.isfinite(v) or i < max(2, spec["min_history"]) or not np.isfinite(before).any():
            continue
        if spec["type"] == "relative":
            limit = spec["factor"] * np.nanmedian(before)
            out[i] = v > limit if spec["op"] == ">" else v < limit
        else:
            mean, sd = np.nanmean(before), np.nanstd(before)
            z = (v - mean) / sd if sd > 0 else 0.0
            out[i] = z > spec["z"] if spec["op"] == ">" else z < -spec["z"]
    return out


def test_custom_rules_judge_each_value_as_defined_batch_after_batch():
    """Running sums and a sorted window give what the definition gives, however the values come in batches."""
    from gradwatch_server.rules.custom import CustomRule

    rng = np.random.default_rng(3)
    values = rng.normal(1.0, 0.4, 1500) + 100.0
    values[rng.random(1500) < 0.05] = np.nan
    base = {"name": "r", "key": "k", "cooldown": 0, "min_history": 10, "severity": "warning"}
    for extra in (
        {"type": "n_of_m", "op": ">", "value": 100.5, "n": 4, "m": 9},
        {"type": "relative", "op": ">", "factor": 1.004, "window": 40},
        {"type": "relative", "op": "<", "factor": 0.996, "window": 101},
        {"type": "zscore", "op": ">", "z": 1.8, "window": 60},
    ):
        spec = {**base, **extra}
        rule, got, at = CustomRule(policy.check_custom(0, spec)), [], 0
        while at < len(values):
            size = int(rng.integers(1, 200))
            got.append(rule.bad(values[at : at + size]))
            at += size
        want = _direct_bad(policy.check_custom(0, spec), values)
        assert want.sum() > 5, extra  # the case is not vacuous
        assert (np.concatenate(got) == want).mean() > 0.999, extra  # float sums may differ on a borderline


def test_rules_over_the_projects_budget_are_refused_naming_it(server, api):
    rule = {"key": "acc", "type": "n_of_m", "op": ">", "value": 2, "n": 5, "m": 10000}
    many = [{**rule, "name": f"r{i}"} for i in range(policy.RULES_BUDGET // 10000 + 1)]
    status, body = api.request("PUT", "/api/projects/p/rules", {"custom": many})
    assert status == 400 and "rules budget" in body["error"] and f"{policy.RULES_BUDGET:,}" in body["error"]
    status, body = api.request("POST", "/api/projects/p/rules/backtest", {"custom": many})
    assert status == 400 and "rules budget" in body["error"]
    assert api.request("PUT", "/api/projects/p/rules", {"custom": many[:-1]})[0] == 200


def test_what_get_rules_returns_is_accepted_back_by_put_and_backtest(server, api):
    doc = {
        "thresholds": {"loss_spike.factor": 8},
        "custom": [{"name": "a", "key": "acc", "type": "threshold", "value": 1}],
    }
    assert api.request("PUT", "/api/projects/p/rules", doc)[0] == 200
    got = api.get("/api/projects/p/rules")
    got["thresholds"]["loss_spike.factor"] = 9  # a script that edits one threshold and sends it all back
    status, body = api.request("PUT", "/api/projects/p/rules", got)
    assert status == 200, body
    assert body["thresholds"]["loss_spike.factor"] == 9.0 and body["custom"] == got["custom"]
    assert api.request("POST", "/api/projects/p/rules/backtest", got)[0] == 200


def test_a_replay_stops_at_its_budget_its_deadline_and_when_the_client_leaves(server, api, monkeypatch):
    import threading

    from gradwatch_server.rules import backtest

    for name in ("a", "b", "c"):
        run = gradwatch.init(project="big", name=name, server=server.url)
        for step in range(300):
            run.log({"loss": 1.0, "acc": 0.9}, step=step)
        run.finish()
    proposed = {"custom": [{"name": "acc", "key": "acc", "type": "relative", "op": "<", "factor": 0.5}]}
    status, out = api.request("POST", "/api/projects/big/rules/backtest", proposed)
    assert status == 200 and out["complete"] and out["stopped"] is None and len(out["runs"]) == 3
    monkeypatch.setattr(backtest, "POINTS_BUDGET", 700)  # two runs' 300 acc points fit, not three
    status, out = api.request("POST", "/api/projects/big/rules/backtest", proposed)
    assert status == 200 and not out["complete"] and len(out["runs"]) == 2
    assert "budget of 700 points x rules" in out["stopped"]
    monkeypatch.undo()
    engine = database.make_engine(server.settings.db_url)
    try:
        with engine.connect() as conn:
            current = {k: v for k, v in policy.EMPTY.items()}
            done = backtest.backtest(conn, "big", current, policy.validate(proposed), limits=backtest.Limits(0.0))
            assert not done["complete"] and "deadline" in done["stopped"] and done["runs"] == []
            gone = threading.Event()
            gone.set()
            left = backtest.backtest(conn, "big", current, policy.validate(proposed), limits=backtest.Limits(stop=gone))
            assert "client left" in left["stopped"]
    finally:
        engine.dispose()


def test_one_replay_at_a_time_per_project(server, api):
    from gradwatch_server.web.routes import rules

    rules.REPLAYING.add("busy")  # a replay of "busy" is running
    try:
        status, body = api.request("POST", "/api/projects/busy/rules/backtest", {})
        assert status == 429 and "one at a time" in body["error"]
        assert api.request("POST", "/api/projects/other/rules/backtest", {})[0] == 200
    finally:
        rules.REPLAYING.discard("busy")
    assert api.request("POST", "/api/projects/busy/rules/backtest", {})[0] == 200
