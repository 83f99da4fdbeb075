"""A non-editable install of the wheel into a fresh venv gives a working ``gradwatch serve``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
from test_cli import free_port, wait_http

ROOT = Path(__file__).resolve().parent.parent
IMPORTED = re.compile(r'^(?:import|export) [^;]*? from "([^"]+)";', re.M | re.S)


def module_url(importer: str, spec: str) -> str:
    """The URL an ES module import resolves to from the importing module's URL."""
    return spec if spec.startswith("/") else normalized(str(PurePosixPath(importer).parent / spec))


def normalized(url: str) -> str:
    parts: list[str] = []
    for part in url.split("/"):
        if part == "..":
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/" + "/".join(parts)


def test_package_data_holds_every_frontend_file():
    """The wheel's packages and package-data globs match every page file (one left out would break pip installs only)."""
    # [tool.setuptools.package-data]'s lists for the frontend and its folders (read as text: tomllib is 3.11+)
    text = (ROOT / "pyproject.toml").read_text()
    listed = re.findall(r'^"gradwatch_server\.frontend((?:\.\w+)*)" = (\[[^\]]*\])$', text, re.M)
    frontend = ROOT / "frontend"
    packaged = set()
    for sub, globs in listed:
        folder = frontend.joinpath(*sub.split(".")[1:])
        assert f'"gradwatch_server.frontend{sub}"' in text.split("[tool.setuptools.dynamic]")[0]  # a package too
        packaged |= {p for g in json.loads(globs) for p in folder.glob(g) if p.is_file()}
    files = {p for p in frontend.rglob("*") if p.is_file()}
    assert files - packaged == set()
    assert any(p.parent.name == "lib" for p in files) and any("pages" in p.parts for p in files)


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
            # ... and every module those import (frontend/lib/, frontend/pages/), followed to the end.
            seen = set()
            while assets:
                asset = assets.pop()
                if asset in seen:
                    continue
                seen.add(asset)
                body = wait_http(f"http://127.0.0.1:{port}{asset}").decode()
                assert body, asset
                if asset.endswith(".js"):
                    assets += [module_url(asset, m) for m in IMPORTED.findall(body) if m != "/contract.js"]
            assert any("/lib/" in a for a in seen) and any("/pages/" in a for a in seen), page
        assert b"Plotly" in wait_http(f"http://127.0.0.1:{port}/static/vendor/plotly.min.js")[:5000]
    finally:
        proc.terminate()
        proc.wait(10)
