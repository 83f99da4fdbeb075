"""A non-editable install of the wheel into a fresh venv gives a working ``gradwatch serve``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import free_port, wait_http

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_install_serves_pages(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], check=True, timeout=300
    )
    wheel = next(dist.glob("gradwatch-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run(pip + [f"{wheel}[server]"], check=True, timeout=600)
    # The client alone must import without server packages in the fresh venv too.
    check = "import gradwatch, sys; assert 'fastapi' not in sys.modules"
    subprocess.run([str(venv / "bin" / "python"), "-c", check], check=True, cwd=tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [str(venv / "bin" / "gradwatch"), "serve", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'w.db'}"],
        cwd=tmp_path,
    )
    try:
        for page in ("/", "/runs/1", "/compare"):
            html = wait_http(f"http://127.0.0.1:{port}{page}").decode()
            # Every asset a page asks for must be in the wheel (a file left out of package-data
            # would break the page for pip users only).
            assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
            assert any(a.endswith(".js") for a in assets), page
            for asset in assets:
                assert wait_http(f"http://127.0.0.1:{port}{asset}"), asset
        assert b"Plotly" in wait_http(f"http://127.0.0.1:{port}/static/vendor/plotly.min.js")[:5000]
    finally:
        proc.terminate()
        proc.wait(10)
