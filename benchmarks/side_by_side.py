"""Run benchmarks from two git trees, alternating, and print every figure as old -> new in one table of lines.

Run: .venv/bin/python benchmarks/side_by_side.py --baseline REV [--rounds N] [--quick] [--new-scripts] [SCRIPT [ARGS...]]

Without SCRIPT: the storage, live-load, ingest and series benchmarks (the figures issue #31 names). The
baseline is ``git archive REV`` in a temporary folder. Its code runs in this virtualenv through an import
finder put first on the path (``sitecustomize`` on PYTHONPATH, which child processes inherit), so both trees
share every dependency and differ only in gradwatch's own code. Each figure is the median over the rounds;
a line whose numbers are equal in both trees is printed once.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [
    ["bench_storage.py"],
    ["bench_load.py", "--runs", "1", "20"],
    ["bench_ingest.py", "--repeat", "1"],
    ["bench_series.py"],
]
HOLE = "\x00"  # where a number was in a line
NUM = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")
FINDER = '''"""Put one git tree's gradwatch first on the import path (benchmarks/side_by_side.py wrote this)."""
import importlib.machinery, importlib.util, os, sys
MAPPING = {mapping!r}
class _Tree:
    @staticmethod
    def find_spec(name, path=None, target=None):
        where = MAPPING.get(name)
        if where is None:
            return None
        init = os.path.join(where, "__init__.py")
        if not os.path.exists(init):  # a folder of data files (the frontend): a namespace package
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [where]
            return spec
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[where])
sys.meta_path.insert(0, _Tree)
'''


def baseline_tree(rev: str, into: Path) -> tuple[Path, dict]:
    """(the environment that runs it, its package map): ``rev``'s files extracted under ``into``."""
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mapping = {name: str(tree / folder) for name, folder in dirs.items()}
    overlay = into / "overlay"
    overlay.mkdir()
    (overlay / "sitecustomize.py").write_text(FINDER.format(mapping=mapping))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(overlay), os.environ.get("PYTHONPATH")]))}
    return tree, env


def which(env: dict) -> str:
    """Where this environment imports gradwatch and its server from (so a reader sees what each column ran)."""
    code = "import gradwatch, gradwatch_server; print(gradwatch.__file__, gradwatch_server.__file__)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip()


def run_once(tree: Path, env: dict, script: list[str], scripts: Path | None = None) -> tuple[list[str], str]:
    """(stdout lines, the load average when it started) of one benchmark run from ``tree`` (its script from
    ``scripts``' benchmarks/ when given: the same driver measuring both trees' code)."""
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    cmd = [sys.executable, str((scripts or tree) / "benchmarks" / script[0]), *script[1:]]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return [f"({script[0]} exited {done.returncode}: {tail[0]})"], load
    return done.stdout.splitlines(), load


def figures(outputs: list[list[str]]) -> dict:
    """(template, its n-th occurrence) -> one list of numbers per round, from each round's lines."""
    out: dict = {}
    for lines in outputs:
        seen: dict = {}
        for line in lines:
            template = NUM.sub(HOLE, line)
            k = seen[template] = seen.get(template, -1) + 1
            out.setdefault((template, k), []).append(NUM.findall(line))
    return out


def _median(tokens: list[str]) -> str:
    """The median of one figure's rounds, written like its first round's token (decimals, thousands commas)."""
    values = [float(t.replace(",", "")) for t in tokens]
    mid = statistics.median(values)
    first = tokens[0]
    if "e" in first.lower():
        return f"{mid:.3g}"
    decimals = len(first.split(".")[1]) if "." in first else 0
    return f"{mid:,.{decimals}f}" if "," in first else f"{mid:.{decimals}f}"


def merged_line(template: str, old: list | None, new: list) -> str:
    """The template with each number as ``old -> new`` (medians), or once when both trees agree."""
    parts = template.split(HOLE)
    cells = []
    for i in range(len(parts) - 1):
        b = _median([r[i] for r in new if i < len(r)])
        a = _median([r[i] for r in old if i < len(r)]) if old else None
        cells.append(b if a in (None, b) else f"{a} -> {b}")
    return "".join(p + c for p, c in zip(parts, [*cells, ""]))


def compare(
    script: list[str], rounds: int, trees: list[tuple[str, Path, dict]], scripts: Path | None = None
) -> list[str]:
    """Both trees' runs of one benchmark, alternating, as merged lines (the new tree's order)."""
    runs: dict = {label: [] for label, _, _ in trees}
    loads = []
    for _ in range(rounds):
        for label, tree, env in trees:
            lines, load = run_once(tree, env, script, scripts)
            runs[label].append(lines)
            loads.append(load)
    old, new = figures(runs["old"]), figures(runs["new"])
    out = [f"## {' '.join(script)}: old -> new, median of {rounds} (load at each start {', '.join(loads)})"]
    order: dict = {}
    for line in runs["new"][0]:
        template = NUM.sub(HOLE, line)
        k = order[template] = order.get(template, -1) + 1
        out.append(merged_line(template, old.get((template, k)), new[(template, k)]))
    gone = [key for key in old if key not in new]
    out += [f"(old only) {merged_line(t, None, old[(t, k)])}" for t, k in gone]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, metavar="REV", help="the old tree: a git revision")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tree, alternating [1]")
    parser.add_argument("--quick", action="store_true", help="pass --quick to each default benchmark")
    parser.add_argument(
        "--new-scripts",
        action="store_true",
        help="run the working tree's benchmark scripts against both trees' code (one driver; an old tree may lack the script)",
    )
    parser.add_argument("script", nargs=argparse.REMAINDER, help="one benchmark and its arguments [the #31 set]")
    args = parser.parse_args()
    scripts = [args.script] if args.script else [s + ["--quick"] * args.quick for s in DEFAULT]
    with tempfile.TemporaryDirectory(prefix="gw-side-") as tmp:
        old_tree, old_env = baseline_tree(args.baseline, Path(tmp))
        trees = [("old", old_tree, old_env), ("new", ROOT, dict(os.environ))]
        print(f"old: {args.baseline} (gradwatch from {which(old_env)})")
        print(f"new: the working tree {ROOT} (gradwatch from {which(dict(os.environ))})")
        for script in scripts:
            print()
            print("\n".join(compare(script, args.rounds, trees, ROOT if args.new_scripts else None)), flush=True)


if __name__ == "__main__":
    main()
