"""gradwatch export and gradwatch runs ls|rm against a real server (and its database with --db)."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
import torch

import gradwatch
from gradwatch_server import cli

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.1, 1e-300, -2.5e17]


def seed(server, name="exp", project="p", steps=30):
    """A run with a watched model (per-layer norms) and a loss that goes NaN/inf."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = gradwatch.init(project=project, name=name, config={"lr": 0.1}, server=server.url)
    run.watch(model, opt)
    for step in range(steps):
        loss = model(torch.randn(4, 3)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss, "acc": step / steps}, step=step)
    for i, v in enumerate(SPECIAL):
        run.log({"odd": v}, step=steps + i)
    run.finish()
    return run.id


def cli_run(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def test_export_csv_has_every_point_exactly(server, api, tmp_path, capsys):
    run_id = seed(server)
    out = tmp_path / "run.csv"
    code, _, err = cli_run(["export", str(run_id), "--server", server.url, "-o", str(out)], capsys)
    assert code == 0 and "exported run" in err and "keys" in err  # progress lines
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    by_key: dict = {}
    for r in rows:
        by_key.setdefault(r["key"], []).append(r)
    keys = api.get(f"/api/runs/{run_id}/keys")
    assert set(by_key) == set(keys) and "grad/weight" in by_key
    for key in keys:
        s = api.get(f"/api/runs/{run_id}/series?key={key}")
        assert [int(r["step"]) for r in by_key[key]] == s["steps"]
        assert [float(r["wall_time"]) for r in by_key[key]] == s["wall_times"]
    odd = [float(r["value"]) for r in by_key["odd"]]
    assert math.isnan(odd[0]) and odd[1:] == SPECIAL[1:]  # inf, -inf and every float bit for bit


def test_export_json_and_by_name(server, api, tmp_path, capsys):
    seed(server, name="by-name")
    out = tmp_path / "run.json"
    code, _, _ = cli_run(["export", "by-name", "--format", "json", "--server", server.url, "-o", str(out)], capsys)
    data = json.loads(out.read_text())
    assert code == 0 and data["run"]["name"] == "by-name" and data["run"]["config"] == {"lr": 0.1}
    assert data["series"]["odd"]["values"][:3] == ["NaN", "Infinity", "-Infinity"]
    assert data["series"]["odd"]["values"][3:] == SPECIAL[3:]
    assert len(data["series"]["loss"]["steps"]) == 30


def test_export_reads_the_database_directly(server, settings, tmp_path, capsys):
    run_id = seed(server)
    code, out, _ = cli_run(["export", str(run_id), "--db", settings.db_url, "-o", "-", "--keys", "odd"], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0] == "run_id,key,step,wall_time,value"
    assert [line.rsplit(",", 1)[1] for line in lines[1:]] == ["nan", "inf", "-inf", "0.1", "1e-300", "-2.5e+17"]


def test_export_parquet(server, tmp_path, capsys):
    run_id = seed(server)
    out = tmp_path / "run.parquet"
    code, _, err = cli_run(
        ["export", str(run_id), "--format", "parquet", "--server", server.url, "-o", str(out)], capsys
    )
    try:
        import pyarrow.parquet as pq
    except ImportError:
        assert code == 1 and "pip install pyarrow" in err and not out.exists()
        return
    table = pq.read_table(out).to_pydict()
    odd = [v for k, v in zip(table["key"], table["value"]) if k == "odd"]
    assert code == 0 and math.isnan(odd[0]) and odd[1:] == SPECIAL[1:]


def test_export_unknown_run_and_no_server(server, capsys):
    code, _, err = cli_run(["export", "999", "--server", server.url], capsys)
    assert code == 1 and "run 999 not found" in err
    code, _, err = cli_run(["export", "1", "--server", "http://127.0.0.1:9"], capsys)
    assert code == 1 and "cannot reach the gradwatch server" in err and "Traceback" not in err


def test_runs_ls_and_rm(server, api, capsys):
    a, b = seed(server, "first", steps=3), seed(server, "second", project="q", steps=3)
    code, out, _ = cli_run(["runs", "ls", "--server", server.url, "--json"], capsys)
    assert code == 0 and [r["id"] for r in json.loads(out)] == [b, a]
    code, out, _ = cli_run(["runs", "ls", "--server", server.url, "--project", "q"], capsys)
    lines = out.splitlines()
    assert (
        lines[0].split() == ["ID", "PROJECT", "NAME", "STATUS", "STEP", "ALERTS", "WORST", "OPEN"] and len(lines) == 2
    )
    assert lines[1].split()[:4] == [str(b), "q", "second", "finished"]
    code, _, err = cli_run(["runs", "rm", str(a), "--server", server.url], capsys)  # not a terminal: must confirm
    assert code == 1 and "--yes" in err and len(api.get("/api/runs")) == 2
    code, _, err = cli_run(["runs", "rm", str(a), "404", "--yes", "--server", server.url], capsys)
    assert code == 1 and "404" in err and len(api.get("/api/runs")) == 2  # none deleted when one is unknown
    code, out, _ = cli_run(["runs", "rm", "first", "--yes", "--json", "--server", server.url], capsys)
    assert code == 0 and json.loads(out) == {"deleted": [a]}
    assert [r["id"] for r in api.get("/api/runs")] == [b]


HOSTILE = "\x1b]0;pwned\x07\x1b[31mred\n9999  evil  forged-row"


def test_csv_cells_cannot_be_formulas_and_terminal_output_cannot_carry_escapes(server, tmp_path, capsys):
    """Issue #18: keys like =HYPERLINK(...) are text in a spreadsheet; names with escapes print inert."""
    run = gradwatch.init(project="p", name=HOSTILE, server=server.url)
    formulas = ['=HYPERLINK("http://evil.example","x")', "@SUM(1)", "+1+cmd", "-2+3", "\tTAB", "plain"]
    for step in range(3):
        run.log({k: 1.0 for k in formulas}, step=step)
    run.finish()
    out = tmp_path / "run.csv"
    code, _, err = cli_run(["export", str(run.id), "--server", server.url, "-o", str(out)], capsys)
    assert code == 0 and "\x1b" not in err
    keys = {r["key"] for r in csv.DictReader(io.StringIO(out.read_text()))}
    assert {"'" + k for k in formulas[:-1]} | {"plain"} <= keys
    assert not any(k.startswith(("=", "+", "-", "@", "\t")) for k in keys)
    code, out_text, _ = cli_run(["runs", "ls", "--server", server.url], capsys)
    assert code == 0 and "\x1b" not in out_text and "\x07" not in out_text
    assert len(out_text.splitlines()) == 2  # the newline in the name forged no row
    assert "\\x1b]0;pwned" in out_text
