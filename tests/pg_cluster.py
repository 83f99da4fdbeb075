"""A throwaway PostgreSQL cluster for tests and benchmarks (initdb + pg_ctl as an unprivileged user)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def as_user(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: use an unprivileged account for the throwaway cluster.
    return ["runuser", "-u", "nobody", "--"] + cmd if os.geteuid() == 0 else cmd


@contextlib.contextmanager
def cluster():
    """Start a cluster on a free port; yields its URL (database ``postgres``, user ``gw``, trust auth)."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not initdb or not pg_ctl:
        raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) are required")
    # Not under pytest's tmp dir: that one is private to root, and the cluster runs as nobody.
    base = Path(tempfile.mkdtemp(prefix="gradwatch-pg-"))
    if os.geteuid() == 0:
        shutil.chown(base, "nobody")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = base / "data"
    subprocess.run(
        as_user([initdb, "-D", str(data), "-U", "gw", "--auth=trust", "-E", "UTF8"]), check=True, capture_output=True
    )
    subprocess.run(
        as_user(
            [
                pg_ctl,
                "-D",
                str(data),
                "-l",
                str(base / "log"),
                "-w",
                "-o",
                f"-p {port} -k {base} -c listen_addresses=127.0.0.1",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://gw@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_user([pg_ctl, "-D", str(data), "-m", "fast", "stop"]), capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def optional_cluster(enabled: bool):
    """``cluster()`` when enabled, else a context that yields None (a benchmark's ``--postgres``)."""
    return cluster() if enabled else contextlib.nullcontext()


def fresh_database(cluster_url: str) -> str:
    """A new, empty database in the cluster; its URL."""
    import time

    from sqlalchemy import create_engine, text

    name = f"gw_bench_{time.monotonic_ns()}"
    admin = create_engine(cluster_url.replace("postgresql://", "postgresql+psycopg2://"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return cluster_url.rsplit("/", 1)[0] + "/" + name
