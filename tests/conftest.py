"""Shared fixtures (settings passed in, never patched globals; one real-server fixture) and the lanes.

Lanes: a test is ``browser`` (drives Chromium), ``slow`` (PostgreSQL, wheels, long soaks), ``server``
(boots uvicorn, ``gradwatch serve`` or any other process) or, unmarked, a unit test (in-process only);
``scripts/test.sh --fast`` runs the unit tests alone. The marks are set here from the fixtures a test
uses and the code it and they call; a test that starts a server or a process without its mark fails.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request

import children
import pytest
from waiting import wait_until

from gradwatch_server.serve import BackgroundServer
from gradwatch_server.settings import Settings

CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

LANES = ("browser", "slow", "server")
# What puts a test in a lane: a fixture it uses (directly or through others), or a call in its code.
LANE_FIXTURES = {"browser": {"browser", "page"}, "slow": {"postgres_url"}, "server": {"server", "api"}}
SERVER_CALLS = re.compile(r"\b(BackgroundServer|ServerProcess|Popen|subprocess\.\w+|run_benchmark)\(")
CALLS = re.compile(r"\b(\w+)\(")
TESTS = os.path.dirname(os.path.abspath(__file__))


def _in_tests(fn) -> bool:
    return inspect.isfunction(fn) and os.path.dirname(os.path.abspath(inspect.getfile(fn))) == TESTS


def _sources(item) -> list[str]:
    """The code of a test, of every fixture it uses and of the suite's helpers they call."""
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else []:
        funcs += [d.func for d in defs]
    seen, out = set(), []
    while funcs:
        fn = funcs.pop()
        fn = inspect.unwrap(fn) if callable(fn) else fn
        if not _in_tests(fn) or fn in seen:
            continue
        seen.add(fn)
        src = inspect.getsource(fn)
        out.append(src)
        funcs += [g for name in CALLS.findall(src) if _in_tests(g := fn.__globals__.get(name))]
    return out


def pytest_collection_modifyitems(config, items):
    """Marks every test with its lane, so ``-m "not server and not browser and not slow"`` is the unit lane."""
    for item in items:
        names = set(item.fixturenames)
        for lane in LANES:
            if names & LANE_FIXTURES[lane]:
                item.add_marker(lane)
        if not any(item.get_closest_marker(lane) for lane in LANES):
            if any(SERVER_CALLS.search(src) for src in _sources(item)):
                item.add_marker("server")


def pytest_configure(config):
    children.install()


def _unit(item) -> bool:
    return not any(item.get_closest_marker(lane) for lane in LANES)


def _refuse_for(item):
    def refuse(*args, **kwargs):
        raise RuntimeError(
            f"{item.nodeid} starts a server or a process but is not marked: add @pytest.mark.server "
            "(or use the server/api fixture), so scripts/test.sh --fast leaves it out"
        )

    return refuse


@contextlib.contextmanager
def _unit_starts_nothing(item):
    """A unit test may start no server and no process of its own: it would slow down the fast lane."""
    if not _unit(item):
        yield
        return
    with children.refused(_refuse_for(item)):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    # Setup and the call only: a wider-scoped fixture of an earlier test (a PostgreSQL cluster, a module's
    # server) may end its processes in the teardown that pytest runs after whichever test comes last.
    with _unit_starts_nothing(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """What a test's own code started ends when it returns or fails (fixtures end theirs, or exit does)."""
    with _unit_starts_nothing(item), children.owned_by_test():
        return (yield)


@pytest.fixture(autouse=True)
def _unit_tests_boot_no_server(request, monkeypatch):
    if _unit(request.node):
        monkeypatch.setattr(BackgroundServer, "start", _refuse_for(request.node))


@pytest.fixture
def settings(tmp_path) -> Settings:
    """A server configuration on a fresh SQLite file and a free port."""
    return Settings(host="127.0.0.1", port=0, db=f"sqlite:///{tmp_path / 'gradwatch.db'}", crash_timeout=30.0)


@pytest.fixture
def server(settings):
    """A real uvicorn server on port 0 with a real SQLite file."""
    srv = BackgroundServer(settings).start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def _spool(tmp_path, monkeypatch):
    """Client spool files go to the test's own directory."""
    monkeypatch.setenv("GRADWATCH_SPOOL_DIR", str(tmp_path / "spool"))


class Api:
    """Tiny HTTP client for the JSON API of a running server."""

    def __init__(self, base: str):
        self.base = base

    def request(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"} if data else {}
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def get(self, path: str):
        status, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return body


def wait_runs(api: Api, n: int = 1) -> None:
    """Wait until the server has at least ``n`` runs (a client creates its run when it connects)."""
    wait_until(lambda: len(api.get("/api/runs")) >= n, timeout=10, message=f"fewer than {n} runs")


@pytest.fixture
def api(server) -> Api:
    return Api(server.url)


@pytest.fixture(scope="module")
def postgres_url():
    """A throwaway PostgreSQL cluster (one per test module), as a URL."""
    from pg_cluster import cluster

    with cluster() as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    """Real Chromium (Debian's) driven by Playwright."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}; run .ci/setup (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
            ],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.js_errors = errors
    yield pg
    context.close()


def in_thread(fn, *args):
    """Call ``fn`` on a thread of its own and return (or raise) what it did: the session's Playwright
    browser keeps an event loop running in the main thread, where asyncio.run() refuses to start."""
    import threading

    out: dict = {}

    def target():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # re-raised in the test's thread (SystemExit too)
            out["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def run_async(coro):
    """Run a coroutine to completion on a fresh loop in its own thread (see ``in_thread``)."""
    import asyncio

    return in_thread(asyncio.run, coro)


def run_benchmark(script: str, *args: str, timeout: float = 300) -> str:
    """Run ``benchmarks/<script>`` as a user would (its ``--quick`` mode in CI); its stdout, after asserting it succeeded."""
    import sys
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
