"""gradwatch next to the tools users would pick instead, in one run on one machine.

Run: .venv/bin/python benchmarks/bench_peers.py [--quick] [--peers all|trackio,tensorboard,...]
     [--repeat 3] [--no-install] [--out table.md]
gradwatch runs from this venv against a real ``gradwatch serve`` on a fresh SQLite file; each peer
(trackio, TensorBoard, MLflow, wandb offline, Aim) runs from its own virtualenv under
benchmarks/.peers-venv/<tool> (created here with `pip install <tool> torch==2.13.0`; never a
project dependency). Every measurement is a fresh worker process (benchmarks/peers/worker.py) in a
fresh directory, driving the tool through the same calls (benchmarks/peers/use_<tool>.py).
--quick: small sizes, gradwatch only unless --peers is given; peers whose venv is absent are
reported as not installed (CI runs this, see tests/test_bench_peers.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_ingest import Server  # noqa: E402
from peers import venvs  # noqa: E402

WORKER = HERE / "peers" / "worker.py"
TOOLS = ["gradwatch", *venvs.PEERS]
SIZES = {  # per task: the worker's size argument
    # MLflow's synchronous log_metrics (~5 ms a call here) bounds logcost/ingest sizes for a one-run budget
    "full": {"logcost": 5_000, "loop": 400, "ingest": 10_000, "latency": 20, "chart": 1_000_000},
    "quick": {"logcost": 500, "loop": 20, "ingest": 500, "latency": 3, "chart": 2_000},
}
# everything the tools might write or phone home with goes nowhere / into the worker's own folder
QUIET = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "HF_HUB_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "AIM_UI_TELEMETRY_ENABLED": "0",
    "TQDM_DISABLE": "1",
}


def python_for(tool: str) -> tuple[str | None, str]:
    """The interpreter that runs ``tool`` and, if none, why."""
    if tool == "gradwatch":
        return sys.executable, ""
    state = venvs.status(tool)
    if not state["ok"] or not venvs.python(tool).exists():
        return None, state["why"] or "not installed"
    return str(venvs.python(tool)), ""


def run_worker(tool: str, task: str, size: int, timeout: float) -> dict:
    """One measurement in a fresh process and folder; {"error": why} if it failed."""
    py, _ = python_for(tool)
    with tempfile.TemporaryDirectory(prefix=f"peer-{tool}-") as d:
        tmp = Path(d)
        env = {**os.environ, **QUIET, "HOME": str(tmp / "home")}  # ~/.cache, ~/.config land here
        server = Server(tmp) if tool == "gradwatch" and task != "version" else None
        if server:
            # GRADWATCH_MODE: gradwatch also honours WANDB_MODE (offline here, for the wandb peer)
            env.update(GRADWATCH_SERVER=server.url, GRADWATCH_BENCH_DB=str(server.db), GRADWATCH_MODE="online")
        try:
            done = subprocess.run(
                [py, str(WORKER), tool, task, str(size), str(tmp)],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"no result within {timeout:.0f} s"}
        finally:
            if server:
                server.stop()
    for line in done.stdout.splitlines()[::-1]:
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return {"error": (lines[-1] if lines else f"exit {done.returncode}")[:160]}


def measure(tool: str, sizes: dict, repeat: int) -> dict:
    """task -> list of worker results (one per repeat; the chart task repeats its reads instead)."""
    out = {"version": [run_worker(tool, "version", 0, 300)]}
    for task, size in sizes.items():
        times = 1 if task == "chart" else repeat
        out[task] = []
        for _ in range(times):
            got = run_worker(tool, task, size, 3600)
            out[task].append(got)
            if "error" in got or "na" in got:
                break  # the same failure again teaches nothing
        print(f"  {tool} {task}: {_brief(out[task])}", file=sys.stderr, flush=True)
    return out


def _brief(results: list) -> str:
    return "; ".join(json.dumps(r)[:200] for r in results)


def spread(values: list, fmt: str) -> str:
    """median [min-max] of the repeats."""
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def cell(results: list, key: str, fmt: str) -> str:
    bad = next((r for r in results if "error" in r or "na" in r), None)
    if bad:
        return f"n/a ({bad['na']})" if "na" in bad else f"failed ({bad['error']})"
    values = [v for r in results for v in (r[key] if isinstance(r[key], list) else [r[key]])]
    return spread(values, fmt)


ROWS = [  # (row label, task, result key, number format)
    ("`log()` cost on the training thread, µs per call of 5 scalars", "logcost", "value", "{:,.1f}"),
    ("Step-time overhead, small CPU MLP logging loss + 4 scalars each step, %", "loop", "value", "{:+.1f}"),
    ("Points/s ingested (first `log()` → all readable by the tool's reader)", "ingest", "value", "{:,.0f}"),
    ("`log()` → visible, median ms at 10 steps/s", "latency", "value", "{:,.1f}"),
    ("Chart read of 1M points, full resolution, s", "chart", "values", "{:,.3f}"),
    ("Bytes on disk per stored point", "ingest", "bytes_per_point", "{:,.1f}"),
]


def table(results: dict, sizes: dict) -> list[str]:
    tools = list(results)
    lines = ["| | " + " | ".join(tools) + " |", "|---|" + "---|" * len(tools)]
    for label, task, key, fmt in ROWS:
        if task == "chart" and sizes["chart"] != 1_000_000:
            label = label.replace("1M", f"{sizes['chart']:,}")
        cells = [r.get("missing") or cell(r[task], key, fmt) for r in results.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    gw = results.get("gradwatch", {}).get("chart", [])
    if gw and "down" in gw[0]:
        lines.append(
            "| Chart read, gradwatch's 2,000-point min/max view (`max_points=2000`), s | "
            + cell(gw, "down", "{:,.3f}")
            + " |"
            + " |" * (len(tools) - 1)
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; gradwatch only unless --peers")
    parser.add_argument("--peers", default=None, help="'all' or a comma list (default: all, or none with --quick)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-install", action="store_true", help="never create venvs; absent peers: not installed")
    parser.add_argument("--install-only", action="store_true", help="create the peers' venvs, measure nothing")
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    args = parser.parse_args()
    peers = (
        list(venvs.PEERS)
        if (args.peers or ("" if args.quick else "all")) == "all"
        else [p for p in (args.peers or "").split(",") if p]
    )
    sizes, repeat = SIZES["quick" if args.quick else "full"], 1 if args.quick else args.repeat
    if args.install_only:
        for tool in peers:
            print(tool, venvs.install(tool))
        return
    results = {}
    for tool in TOOLS:
        wanted = tool == "gradwatch" or tool in peers
        if wanted and tool != "gradwatch" and not args.no_install and not venvs.status(tool)["ok"]:
            print(f"installing {tool} into {venvs.VENVS / tool} ...", file=sys.stderr, flush=True)
            venvs.install(tool)
        py, why = python_for(tool)
        if py is None:
            results[tool] = {"missing": why if why == "not installed" else f"not installed ({why})"}
        elif not wanted:
            results[tool] = {"missing": "not run (add --peers)"}
        else:
            results[tool] = measure(tool, sizes, repeat)
    report = render(results, sizes, repeat)
    print(report)
    if args.out:
        args.out.write_text(report)


def render(results: dict, sizes: dict, repeat: int) -> str:
    out = [
        f"machine: {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        f"command: {' '.join([Path(sys.executable).name, *sys.argv])}",
        f"sizes: {json.dumps(sizes)}; repeats: {repeat} (cells: median [min–max] over repeats)",
        "",
        "versions:",
    ]
    for tool, r in results.items():
        v = r.get("missing") or (r["version"][0].get("version") or r["version"][0].get("error"))
        out.append(f"- {tool}: {v}")
    out += ["", *table(results, sizes), "", 'What "visible" means for each tool:']
    for tool, r in results.items():
        if not r.get("missing") and "visible" in r["version"][0]:
            out.append(f"- {tool}: {r['version'][0]['visible']}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
