"""What a run records about where it ran: host, process, versions, device, git commit."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time


def git_commit(cwd: str | None = None) -> str | None:
    """The commit of the working directory's git checkout, or None."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def collect() -> dict:
    """Metadata captured at init; never raises."""
    meta = {
        "start_time": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": [sys.executable, *sys.argv],
        "cwd": os.getcwd(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
    }
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F811 - users of gradwatch train with torch; import is cheap once loaded
        except ImportError:
            torch = None
    if torch is not None:
        meta["torch"] = torch.__version__
        meta.update(_device_info(torch))
    return meta


def _device_info(torch) -> dict:
    try:
        if torch.cuda.is_available():
            index = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            return {"device": f"cuda:{index} {props.name}", "cuda_total_memory": int(props.total_memory),
                    "cuda_version": torch.version.cuda}
    except Exception:
        pass
    return {"device": f"cpu ({platform.processor() or platform.machine()})"}
