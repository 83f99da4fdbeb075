"""What a run records about where it ran: host, process, versions, device, git commit."""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
import time

REDACTED = "***"
# A flag or variable is secret if one of its words is one of these (hf_token, --api-key, DB_PASSWORD).
SECRET_WORDS = frozenset(
    {
        "token",
        "tokens",
        "key",
        "keys",
        "apikey",
        "secret",
        "secrets",
        "password",
        "passwd",
        "pwd",
        "pass",
        "auth",
        "authorization",
        "credential",
        "credentials",
    }
)
SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "apikey", "credential", "credentials")
URL_PASSWORD = re.compile(r"(://[^/:@\s]*:)[^/@\s]+@")  # scheme://user:PASSWORD@host
# Recorded so a run says how it was launched (distributed rank, devices); secrets among them redacted.
ENV_PREFIXES = (
    "GRADWATCH_",
    "CUDA_VISIBLE_DEVICES",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
)


def git_commit(cwd: str | None = None) -> str | None:
    """The commit of the working directory's git checkout, or None."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def is_secret_name(name: str) -> bool:
    """True for names like --token, api_key, HF_TOKEN, db.password, GRADWATCH_TOKEN."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return any(w in SECRET_WORDS or w.endswith(SECRET_SUFFIXES) for w in words)


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with values of secret-named flags (and URL passwords) replaced by ***."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, _value = arg.partition("=")
        if eq and is_secret_name(name):  # --token=x, token=x, db.password=x (Hydra style)
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and is_secret_name(arg):  # --token x: the value is the next argument
            out.append(arg)
            hide_next = True
        else:
            out.append(URL_PASSWORD.sub(rf"\1{REDACTED}@", arg))
    return out


def recorded_env(environ=None) -> dict:
    """The launch-related environment variables, secret ones as ***."""
    environ = os.environ if environ is None else environ
    return {
        k: REDACTED if is_secret_name(k) else URL_PASSWORD.sub(rf"\1{REDACTED}@", v)
        for k, v in sorted(environ.items())
        if k.startswith(ENV_PREFIXES)
    }


def distributed(environ=None) -> dict:
    """World size and ranks that launchers (torchrun, SLURM) put in the environment."""
    environ = os.environ if environ is None else environ
    out = {}
    for var, key in (("WORLD_SIZE", "world_size"), ("RANK", "rank"), ("LOCAL_RANK", "local_rank")):
        if environ.get(var, "").strip().isdigit():
            out[key] = int(environ[var])
    return out


def collect() -> dict:
    """Metadata captured at init; never raises."""
    meta = {
        "start_time": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": redact_argv([sys.executable, *sys.argv]),
        "env": recorded_env(),
        **distributed(),
        "cwd": os.getcwd(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
    }
    torch = sys.modules.get("torch")  # never imported here: that alone costs ~1.5 s (watch() records it later)
    if torch is not None:
        meta["torch"] = torch.__version__
        meta.update(device_info(torch))
    return meta


def device_info(torch) -> dict:
    """The device, without creating a CUDA context.

    init() often runs before the script's ``torch.cuda.set_device(local_rank)``: current_device(),
    get_device_properties() or mem_get_info() here would initialise CUDA and put a context (and
    hundreds of MB) on GPU 0 in every rank. is_available()/device_count() do not; the device's
    name is only read if the script has initialised CUDA itself.
    """
    try:
        if torch.cuda.is_available():
            info = {"cuda_device_count": torch.cuda.device_count(), "cuda_version": torch.version.cuda}
            if not torch.cuda.is_initialized():
                return {"device": "cuda", **info}
            index = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            return {"device": f"cuda:{index} {props.name}", "cuda_total_memory": int(props.total_memory), **info}
    except Exception:
        pass
    return {"device": f"cpu ({platform.processor() or platform.machine()})"}
