"""torch.distributed: two real processes on the gloo backend stream to a real server."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

from conftest import Api

import gradwatch
from gradwatch import distributed
from gradwatch_server.serve import BackgroundServer

DOC = Path(__file__).resolve().parent.parent / "docs" / "integrations" / "distributed.md"
SCRIPT = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[0]
# Put after each rank's run.finish(): it got there, and which threads are still alive then.
FINISHED = 'import threading\nprint("finished with threads:", [t.name for t in threading.enumerate()], flush=True)\n'
ONLY_MAIN = "finished with threads: ['MainThread']"
# libstdc++'s words when torch's gloo process group aborts its shutdown; seen once in CI (1 in many
# hundreds of runs), in the rank that runs no gradwatch code (a NoopRun) and leaves first.
TORCH_TEARDOWN_ABORT = "terminate called without an active exception"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, server, script: str, world: int = 2) -> None:
    """What torchrun does: one process per rank, rendezvous through MASTER_ADDR/PORT."""
    path = tmp_path / "train.py"
    assert script.count("run.finish()\n") == 1
    path.write_text(script.replace("run.finish()\n", "run.finish()\n" + FINISHED))
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
            "PYTHONFAULTHANDLER": "1",  # a crash prints every Python thread's stack
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
        check_exit(p.returncode, out)


def check_exit(code: int, out: str) -> None:
    """A rank finished its run, with every gradwatch thread gone, and exited cleanly.

    The one exit tolerated: an abort after that, in libstdc++'s words for torch's gloo shutdown: only
    ``dist.destroy_process_group()`` and the interpreter's teardown are left, and gradwatch has nothing
    left to do (its run finished, its threads gone).
    """
    assert ONLY_MAIN in out, out
    if code != 0:
        assert code == -signal.SIGABRT and TORCH_TEARDOWN_ABORT in out.split(ONLY_MAIN, 1)[1], out
        warnings.warn(f"torch aborted a rank's shutdown after its run finished: {out!r}", stacklevel=2)


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


def test_a_rank_that_sleeps_in_its_loop_is_named_the_straggler(settings, tmp_path, page):
    # DDP keeps the ranks in step, so rank 1's sleep before its forward shows as its data wait (the others
    # spend that time waiting for it in the all-reduce); the watch runs every 0.5 s with crash_timeout=2.
    srv = BackgroundServer(dataclasses.replace(settings, crash_timeout=2.0)).start()
    try:
        api = Api(srv.url)
        slow = SCRIPT.replace("range(20)", "range(40)").replace(
            "    x = torch.randn(16, 8)\n", "    x = torch.randn(16, 8)\n    if rank == 1:\n        time.sleep(0.1)\n"
        )
        launch(tmp_path, srv, "import time\n" + slow)
        runs = sorted(api.get("/api/runs"), key=lambda r: r["name"])
        ranks = api.get(f"/api/runs/{runs[0]['id']}/ranks")
        fast, late = ranks["ranks"]
        assert ranks["straggler"] == late["id"] == runs[1]["id"] and late["straggler"] and not fast["straggler"]
        assert late["data_wait"] - fast["data_wait"] > 0.05 and fast["step_time"] > 0.05  # in step: both wait
        alerts = api.get(f"/api/runs/{late['id']}/alerts")
        assert [a["kind"] for a in alerts if a["kind"] == "straggler"] == ["straggler"]
        assert "Rank 1 is the straggler" in next(a["message"] for a in alerts if a["kind"] == "straggler")
        assert not [a for a in api.get(f"/api/runs/{fast['id']}/alerts") if a["kind"] == "straggler"]
        page.goto(f"{srv.url}/runs/{runs[0]['id']}")
        page.wait_for_selector("#rank-straggler", timeout=15000)
        assert page.inner_text("#rank-straggler") == "straggler: rank 1"
        options = page.locator("#rank-select option").all_inner_texts()
        assert options[1].endswith("· straggler") and "/step" in options[0] and not options[0].endswith("straggler")
        assert not page.js_errors
    finally:
        srv.stop()


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


def test_the_straggler_rule_by_step_time_and_by_data_wait():
    from gradwatch_server.storage.ranks import straggler

    def job(*paces):
        return [{"id": i, "step_time": t, "data_wait": w} for i, (t, w) in enumerate(paces)]

    assert straggler(job((0.10, 0.0), (0.10, 0.0), (0.14, 0.0))) == 2  # 40 % slower than the ranks' median
    assert straggler(job((0.10, 0.0), (0.10, 0.0), (0.12, 0.0))) is None  # 20 %: jitter, not a straggler
    assert straggler(job((0.20, 0.01), (0.20, 0.15), (0.20, 0.01))) == 1  # lock-step DDP: it waits on its data
    assert straggler(job((0.20, 0.01), (0.20, 0.04), (0.20, 0.01))) is None
    assert straggler(job((0.20, 0.0), (None, None))) is None  # one rank with a pace: nothing to compare


def test_a_straggler_that_waits_between_steps_names_its_dataloader_only_when_one_is_measured():
    from gradwatch_server.ingest.liveness import straggler_alert

    ranks = [
        {"rank": i, "id": i, "step_time": 0.2, "data_wait": w, "last_step": 100} for i, w in enumerate((0.01, 0.15))
    ]
    job, slow = {"ranks": ranks}, ranks[1]
    unmeasured = straggler_alert(job, slow).message  # no perf/loader_wait: its own code, never "data loading"
    assert "No DataLoader is measured" in unmeasured and "num_workers" not in unmeasured, unmeasured
    slow_loader = straggler_alert(job, slow, loader=0.14).message
    assert "Its DataLoader takes 0.14 s" in slow_loader and "num_workers" in slow_loader, slow_loader
    fast_loader = straggler_alert(job, slow, loader=0.01).message  # a DataLoader that is not the difference
    assert "only 0.01 s" in fast_loader and "num_workers" not in fast_loader, fast_loader
