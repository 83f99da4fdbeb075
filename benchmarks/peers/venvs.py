"""One virtualenv per peer tool under benchmarks/.peers-venv/<tool>, created on demand.

The peers are never project dependencies: each gets its own venv (a peer's pins can't break
another's or gradwatch's), plus torch==2.13.0 pinned exactly, because an unpinned torch would pull
a multi-GB CUDA build. If the pinned install fails (a peer that wants another torch), the peer is
installed alone and its training-loop row says torch is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# GRADWATCH_PEERS_VENV moves them (tests point it at an empty folder: "not installed")
VENVS = Path(os.environ.get("GRADWATCH_PEERS_VENV") or Path(__file__).resolve().parent.parent / ".peers-venv")
TORCH = "torch==2.13.0"
# tool -> pip requirements (what a user would `pip install` to get it)
PEERS = {
    "trackio": ["trackio"],
    "tensorboard": ["tensorboard"],  # torch.utils.tensorboard.SummaryWriter writes, EventAccumulator reads
    "mlflow": ["mlflow"],
    "wandb": ["wandb"],
    "aim": ["aim"],
}


def python(tool: str) -> Path:
    return VENVS / tool / "bin" / "python"


def status_file(tool: str) -> Path:
    return VENVS / tool / "gradwatch-bench.json"


def status(tool: str) -> dict:
    """{"ok": bool, "why": str, "torch": bool} of an earlier install, or not installed."""
    try:
        return json.loads(status_file(tool).read_text())
    except (OSError, ValueError):
        return {"ok": False, "why": "", "torch": False}


def _pip(tool: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(python(tool)), "-m", "pip", "install", "-q", *args],
                          capture_output=True, text=True, timeout=1800)


def install(tool: str) -> dict:
    """Create the tool's venv and install it (with pinned torch when possible); remembers the outcome."""
    if status(tool)["ok"]:
        return status(tool)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENVS / tool)], check=True)
    done = _pip(tool, [TORCH, *PEERS[tool]])
    result = {"ok": done.returncode == 0, "torch": done.returncode == 0, "why": ""}
    if not result["ok"]:  # maybe the peer insists on another torch: install it without torch
        alone = _pip(tool, PEERS[tool])
        result = {"ok": alone.returncode == 0, "torch": False,
                  "why": _last_error(alone.stderr if alone.returncode else done.stderr)}
    status_file(tool).write_text(json.dumps(result))
    return result


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if "ERROR" in ln or "error" in ln]
    return (lines[-1] if lines else stderr.strip()[-200:])[:200]


if __name__ == "__main__":  # python benchmarks/peers/venvs.py [tool ...]: install ahead of a run
    for name in sys.argv[1:] or PEERS:
        print(name, install(name), flush=True)
