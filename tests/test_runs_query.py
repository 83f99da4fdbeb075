"""The runs language end to end: summaries kept at ingest, where/order_by/columns over HTTP, the CLI, hostile input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.parse

import numpy as np
import pytest
from conftest import Api
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sqlalchemy import create_engine, select

import gradwatch
from gradwatch_server.serve import BackgroundServer
from gradwatch_server.settings import Settings
from gradwatch_server.storage import db, query, summaries

LRS, OPTS, SEEDS = (1e-4, 1e-3, 1e-2), ("adam", "sgd"), (0, 1)


def val_loss(lr: float, opt: str, seed: int, step: int) -> float:
    return 1.0 / (step + 1) + lr * (3 if opt == "sgd" else 1) + seed * 0.01


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real server with a 12-run sweep (lr x optimizer x seed); one run ends on NaN."""
    tmp = tmp_path_factory.mktemp("sweep")
    srv = BackgroundServer(Settings(host="127.0.0.1", port=0, db=f"sqlite:///{tmp / 'g.db'}")).start()
    for lr in LRS:
        for opt in OPTS:
            for seed in SEEDS:
                config = {"lr": lr, "optimizer": opt, "seed": seed, "model": {"depth": 2 + seed}, "amp": seed == 1}
                run = gradwatch.init(project="sweep", name=f"{opt}-{lr}-{seed}", server=srv.url, config=config)
                for step in range(40):
                    v = val_loss(lr, opt, seed, step)
                    acc = step / 40 if step != 30 else 0.99  # best val/acc is not at the min of val/loss
                    if lr == 1e-2 and opt == "sgd" and seed == 1 and step == 39:
                        v = math.nan
                    run.log({"loss": v * 2, "val/loss": v, "val/acc": acc}, step=step)
                run.finish(timeout=30)
    api = Api(srv.url)
    yield srv, api
    srv.stop()


def runs(api: Api, **params) -> list[dict]:
    return api.get("/api/runs?" + urllib.parse.urlencode(params))


def status_of(api: Api, **params) -> tuple[int, object]:
    return api.request("GET", "/api/runs?" + urllib.parse.urlencode(params))


def test_where_filters_by_config_summary_and_status(sweep):
    _srv, api = sweep
    out = runs(api, where='config.lr < 5e-3 and config.optimizer == "adam" and summary.val/loss.min < 0.5')
    assert sorted(r["name"] for r in out) == ["adam-0.0001-0", "adam-0.0001-1", "adam-0.001-0", "adam-0.001-1"]
    assert all(r["config"]["optimizer"] == "adam" for r in out)
    out = runs(api, where='(config.lr == 0.01 or config.seed in [1]) and not config.optimizer != "sgd"')
    assert sorted(r["name"] for r in out) == ["sgd-0.0001-1", "sgd-0.001-1", "sgd-0.01-0", "sgd-0.01-1"]
    assert len(runs(api, where="config.model.depth >= 3 and config.amp == true")) == 6
    assert len(runs(api, where='config.optimizer not in ["adam", "x"]')) == 6
    assert len(runs(api, where="config.optimizer < 5")) == 0  # a string is never a number
    assert len(runs(api, where='status == "finished"', project="sweep")) == 12
    assert len(runs(api, where='status in ["running", "crashed"]')) == 0
    assert len(runs(api, where="summary.val/loss.nans > 0")) == 1


def test_order_by_summary_with_descending_and_missing_last(sweep):
    _srv, api = sweep
    out = runs(api, order_by="summary.val/loss.min", columns="summary.val/loss")
    mins = [r["summary"]["val/loss"]["min"] for r in out]
    assert mins == sorted(mins) and out[0]["name"] == "adam-0.0001-0"
    desc = runs(api, order_by="-summary.val/loss.min,config.seed")
    assert [r["id"] for r in desc] == [r["id"] for r in reversed(out)]
    by_lr = runs(api, order_by="-config.lr,config.optimizer,name")
    assert [r["config"]["lr"] for r in by_lr[:4]] == [0.01] * 4 and by_lr[0]["name"] == "adam-0.01-0"
    nokey = runs(api, order_by="summary.nope.max")  # no run has it: the default order (newest first) stands
    assert [r["id"] for r in nokey] == sorted((r["id"] for r in nokey), reverse=True)


def test_summaries_are_exact_and_value_at_best_step_of_another_key(sweep):
    _srv, api = sweep
    [run] = runs(api, where='name == "sgd-0.01-1"', columns="summary.val/loss,summary.val/acc.at_min(val/loss)")
    s = run["summary"]["val/loss"]
    assert s["last"] == "NaN" and s["nans"] == 1 and s["count"] == 40 and s["last_step"] == 39
    assert s["min"] == pytest.approx(val_loss(1e-2, "sgd", 1, 38)) and s["min_step"] == 38
    assert s["max"] == pytest.approx(val_loss(1e-2, "sgd", 1, 0)) and s["max_step"] == 0
    assert run["summary"]["val/acc"]["at_min(val/loss)"] == pytest.approx(38 / 40)
    [other] = runs(api, where='name == "adam-0.001-0"', columns="summary.val/acc.at_max(val/acc),summary.loss.min")
    assert other["summary"]["val/acc"]["at_max(val/acc)"] == 0.99
    assert set(other["summary"]) == {"val/acc", "loss"}


def test_bad_expressions_are_400_with_the_column(sweep):
    _srv, api = sweep
    cases = {
        "config.lr <": "at column 12",
        "config.lr < 1 config.x": "at column 15",
        "bogus == 1": "unknown field 'bogus'",
        "summary.loss.median < 1": "summary.<key>",
        'status == "a" and (': "at column 20",
        "config.lr == [1]": "expected a value",
        "config.lr in 1": "expected '['",
        "status < 3": "compares with a string",
        "summary.val/acc.at_min(val/loss) > 1": "column, not a filter",
        "config.lr > true": "does not apply to true/false",
    }
    for where, why in cases.items():
        code, body = status_of(api, where=where)
        assert code == 400, (where, code, body)
        assert body["error"].startswith("where at column") and why in body["error"], (where, body)
        assert "\n" not in body["error"]
    code, body = status_of(api, order_by="-summary.loss.median")  # summary.loss alone: run.summary, else loss.last
    assert code == 400 and body["error"].startswith("order_by at column 1")
    code, body = status_of(api, columns="config.")
    assert code == 400 and body["error"].startswith("columns")


def test_hostile_values_are_bound_parameters(sweep, tmp_path):
    srv, api = sweep
    hostile = [
        'config.optimizer == "adam\' OR 1=1 --"',
        "config.optimizer == 'x\"); DROP TABLE runs; --'",
        'name == "%" or name == "_"',
        "config.lr == 1e308 or config.lr == -1e308 or config.lr > inf",
    ]
    for where in hostile:
        assert runs(api, where=where) == []
    assert len(runs(api)) == 12  # the table is still there, every run in it


JUNK = st.text(
    alphabet=st.sampled_from(list("config.summary.lr loss/min \"'()[],<>=!-+1e3 and or not in true\\")), max_size=60
)


@hsettings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(where=st.one_of(JUNK, st.text(max_size=40)), order=st.one_of(st.none(), JUNK), cols=st.one_of(st.none(), JUNK))
def test_junk_never_500s(sweep, where, order, cols):
    _srv, api = sweep
    params = {"where": where} if order is None else {"where": where, "order_by": order}
    if cols is not None:
        params["columns"] = cols
    code, body = status_of(api, **params)
    assert code in (200, 400, 422), (where, order, code, body)
    if code == 400:
        assert isinstance(body["error"], str) and "\n" not in body["error"]


def test_old_filters_and_columns_listing(sweep):
    _srv, api = sweep
    assert len(runs(api, project="sweep", q="adam-0.01")) == 2
    assert len(runs(api, project="other")) == 0
    assert len(runs(api, limit=5)) == 5
    cols = api.get("/api/columns?project=sweep")
    assert cols == {
        "config": ["amp", "lr", "model.depth", "optimizer", "seed"],
        "summary": ["loss", "val/acc", "val/loss"],
        "runs": len(runs(api, project="sweep")),  # the project's count: the runs list's "6 of N runs"
        "projects": ["sweep"],
    }
    assert api.get("/api/columns?project=other") == {"config": [], "summary": [], "runs": 0, "projects": ["sweep"]}


def test_cli_runs_ls_where_order_by(sweep):
    srv, _api = sweep
    cmd = [sys.executable, "-m", "gradwatch_server.cli", "runs", "ls", "--server", srv.url]
    out = subprocess.run(
        [
            *cmd,
            "--where",
            'config.optimizer == "sgd" and config.seed == 0',
            "--order-by=-summary.val/loss.min",
            "--columns",
            "config.lr,summary.val/loss.min",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "CONFIG.LR" in lines[0] and "SUMMARY.VAL/LOSS.MIN" in lines[0]
    assert [line.split()[2] for line in lines[1:]] == ["sgd-0.01-0", "sgd-0.001-0", "sgd-0.0001-0"]
    js = subprocess.run(
        [*cmd, "--json", "--where", "config.lr > 0.005", "--limit", "3"], capture_output=True, text=True, timeout=60
    )
    assert js.returncode == 0 and len(json.loads(js.stdout)) == 3
    bad = subprocess.run([*cmd, "--where", "config.lr <<"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "where at column 12" in bad.stderr and bad.stderr.count("\n") == 1


def test_summaries_merge_batches_out_of_order_and_backfill(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 's.db'}")
    db.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            db.runs.insert().values(id=1, uid="u", project="p", name="n", status="running", created_at=0, updated_at=0)
        )
        rows = [summaries.batch_row(1, "loss", np.arange(10, 20), np.r_[np.linspace(5, 1, 9), np.nan])]
        summaries.upsert(conn, rows)
        summaries.upsert(conn, [summaries.batch_row(1, "loss", np.array([3, 4]), np.array([-np.inf, 7.0]))])
        summaries.upsert(conn, [summaries.batch_row(1, "loss", np.array([20]), np.array([np.inf]))])
        got = summaries.for_runs(conn, [1])[1]["loss"]
    assert got == {
        "last": "Infinity",
        "min": "-Infinity",
        "max": "Infinity",
        "count": 13,
        "nans": 1,
        "last_step": 20,
        "min_step": 3,
        "max_step": 20,
    }
    with engine.begin() as conn:
        conn.execute(db.summaries.delete())
        assert summaries.backfill(conn) == 0  # no chunks: nothing to do
        assert conn.execute(select(db.summaries)).all() == []


def test_compiled_sql_binds_every_value():
    comp = query.Compiler("sqlite")
    clause = comp.compile(query.parse('config.optimizer == "x\'--" and summary.val/loss.min < 0.5'))
    sql = str(clause.compile(compile_kwargs={}))
    assert "x'--" not in sql and "val/loss" not in sql and "0.5" not in sql
    pg = query.Compiler("postgresql").compile(query.parse('config.a.b == "y"'))
    assert "jsonb_extract_path" in str(
        pg.compile(dialect=__import__("sqlalchemy.dialects.postgresql").dialects.postgresql.dialect())
    )


def test_the_language_on_postgresql(postgres_url):
    """The same expressions on PostgreSQL (jsonb), through the real ingest path."""
    srv = BackgroundServer(Settings(host="127.0.0.1", port=0, db=postgres_url)).start()
    try:
        for i, (lr, opt) in enumerate([(1e-4, "adam"), (1e-3, "sgd"), (1e-2, "adam")]):
            run = gradwatch.init(
                project="pg", name=f"r{i}", server=srv.url, config={"lr": lr, "opt": opt, "m": {"d": i}}
            )
            for step in range(10):
                run.log({"val/loss": 1.0 / (step + 1) + lr, "x": math.inf if step == 9 and i == 2 else step}, step=step)
            run.finish(timeout=30)
        api = Api(srv.url)
        out = runs(api, project="pg", where='config.lr < 5e-3 and config.opt in ["adam", "x"] or config.m.d == 2')
        assert sorted(r["name"] for r in out) == ["r0", "r2"]
        assert len(runs(api, project="pg", where="config.opt < 3 or not config.lr > 0")) == 0
        order = runs(api, project="pg", order_by="-summary.val/loss.min,config.opt", columns="summary.x")
        assert [r["name"] for r in order] == ["r2", "r1", "r0"] and order[0]["summary"]["x"]["max"] == "Infinity"
        assert status_of(api, where="config.lr <")[0] == 400
    finally:
        srv.stop()


def test_an_upgrade_fills_summaries_of_runs_stored_before_them(tmp_path):
    """Runs written by a release without the summaries table get theirs at the next start, from their chunks."""
    from gradwatch_server.storage import chunks, database

    url = f"sqlite:///{tmp_path / 'old.db'}"
    database.make_engine(url).dispose()
    engine = database.connect(url)
    with engine.begin() as conn:
        conn.execute(
            db.runs.insert().values(id=1, uid="u", project="p", name="n", status="finished", created_at=0, updated_at=0)
        )
        key_id = conn.execute(db.metric_keys.insert().values(run_id=1, key="val/loss")).inserted_primary_key[0]
        steps = np.arange(5, dtype=np.int64)
        values = np.array([[3.0], [1.0], [np.nan], [2.0], [np.inf]])
        chunks.append_now(conn, chunks.Tail(slots=1), key_id, chunks.Points(steps, steps * 1.0, values))
        assert conn.execute(select(db.summaries)).all() == []
        conn.exec_driver_sql("DROP TABLE summaries")  # as a release before the table left the database
    engine.dispose()
    engine = database.make_engine(url)  # what a server start does
    with engine.connect() as conn:
        got = summaries.for_runs(conn, [1])[1]["val/loss"]
    assert got == {
        "last": "Infinity",
        "min": 1.0,
        "max": "Infinity",
        "count": 5,
        "nans": 1,
        "last_step": 4,
        "min_step": 1,
        "max_step": 4,
    }
