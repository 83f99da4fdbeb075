"""torch.distributed: two real processes on the gloo backend stream to a real server."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import gradwatch
from gradwatch import distributed

DOC = Path(__file__).resolve().parent.parent / "docs" / "integrations" / "distributed.md"
SCRIPT = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, server, script: str, world: int = 2) -> None:
    """What torchrun does: one process per rank, rendezvous through MASTER_ADDR/PORT."""
    path = tmp_path / "train.py"
    path.write_text(script)
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "GRADWATCH_SERVER": server.url,
            "CUDA_VISIBLE_DEVICES": "",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(path)],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out


def test_only_rank_zero_streams_by_default(server, api, tmp_path):
    launch(tmp_path, server, SCRIPT.replace("all_ranks=True", "all_ranks=False"))
    runs = api.get("/api/runs")
    assert [r["name"] for r in runs] == ["linear"] and runs[0]["status"] == "finished"
    meta = api.get(f"/api/runs/{runs[0]['id']}")["meta"]
    assert meta["world_size"] == 2 and meta["rank"] == 0 and "group" not in meta
    assert api.get(f"/api/runs/{runs[0]['id']}/ranks")["ranks"][0]["rank"] == 0


def test_all_ranks_stream_grouped_runs(server, api, tmp_path, page):
    launch(tmp_path, server, SCRIPT)
    runs = sorted(api.get("/api/runs"), key=lambda r: r["name"])
    assert [r["name"] for r in runs] == ["linear [rank 0]", "linear [rank 1]"]
    metas = [api.get(f"/api/runs/{r['id']}")["meta"] for r in runs]
    assert metas[0]["group"] == metas[1]["group"] and [m["rank"] for m in metas] == [0, 1]
    ranks = api.get(f"/api/runs/{runs[1]['id']}/ranks")
    assert ranks["world_size"] == 2 and [(r["rank"], r["id"]) for r in ranks["ranks"]] == [
        (0, runs[0]["id"]),
        (1, runs[1]["id"]),
    ]
    for r in runs:  # each rank's own loss, 20 steps each (different seeds: different data)
        assert api.get(f"/api/runs/{r['id']}/series?key=loss")["steps"] == list(range(20))
    # The run page: a rank selector and one loss chart with a line per rank.
    page.goto(f"{server.url}/runs/{runs[0]['id']}")
    page.wait_for_function("() => document.getElementById('rank-chart')?.dataset.ranks === '2'", timeout=15000)
    options = page.locator("#rank-select option").all_inner_texts()
    assert [o.split(" ·")[0] for o in options] == ["rank 0", "rank 1"]
    page.select_option("#rank-select", str(runs[1]["id"]))
    page.wait_for_url(f"**/runs/{runs[1]['id']}")
    assert not page.js_errors


def test_ranks_from_the_environment_and_noop_run(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed.rank_and_world() == (3, 4)
    run = gradwatch.init(project="p", name="n", server="http://127.0.0.1:9")  # nothing listens: never dialled
    assert isinstance(run, gradwatch.NoopRun) and run.id is None and not run.should_stop
    run.log({"loss": 1.0})
    run.watch(object())
    run.finish()
    assert run.step == 1
    monkeypatch.setenv("RANK", "0")
    assert distributed.describe(False, "uid", "p", "n") == {"world_size": 4, "rank": 0}
    monkeypatch.setenv("GRADWATCH_GROUP", "job7")
    assert distributed.describe(True, "uid", "p", "n")["group"].startswith("job7/")


def test_init_does_not_import_torch_or_touch_cuda():
    code = (
        "import os, sys; os.environ.update(RANK='1', WORLD_SIZE='2'); import gradwatch; "
        "r = gradwatch.init(project='p'); print(type(r).__name__, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["NoopRun", "False"]
