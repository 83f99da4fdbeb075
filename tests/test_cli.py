"""The ``gradwatch`` command: serve from a subprocess, clear errors, demo end to end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

from waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0) -> bytes:
    """The body of ``url`` once it answers (a server binds its port before it serves)."""

    def body():
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.read()
        except OSError:
            return None

    return wait_until(body, timeout=timeout, interval=0.1, message=f"{url} never answered")


def test_serve_uses_flags_and_env(tmp_path):
    port = free_port()
    env = {**os.environ, "GRADWATCH_DB": f"sqlite:///{tmp_path / 'env.db'}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradwatch_server.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert json.loads(wait_http(f"http://127.0.0.1:{port}/healthz")) == {"status": "ok"}
        assert b"gradwatch" in wait_http(f"http://127.0.0.1:{port}/")
        assert len(wait_http(f"http://127.0.0.1:{port}/static/vendor/plotly.min.js")) > 1_000_000
        assert (tmp_path / "env.db").exists()
    finally:
        proc.terminate()
        proc.wait(10)


def test_bad_setting_is_a_one_line_error():
    out = subprocess.run(
        [sys.executable, "-m", "gradwatch_server.cli", "serve", "--alerts", "not json"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "alerts must be a JSON object" in out.stderr


def _cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "gradwatch_server.cli", *args], capture_output=True, text=True, timeout=60, **kw
    )


def test_version_and_demo_help():
    out = _cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == "gradwatch 0.1.0"
    helped = _cli("demo", "--help").stdout
    assert "diverges" in helped and "database of its own" in helped  # a description, not just the flags


def _one_line_error(out) -> str:
    assert out.returncode not in (0, None), out
    err = out.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_busy_port_is_one_line_naming_the_port_and_the_fix(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        err = _one_line_error(_cli("serve", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'x.db'}"))
    assert f"port {port}" in err and "already in use" in err and "--port" in err


def test_unparsable_db_is_one_line_naming_the_url_and_the_fix():
    err = _one_line_error(_cli("serve", "--port", "0", "--db", "not a url"))
    assert "'not a url' is not a database URL" in err and "sqlite:///" in err
    err = _one_line_error(_cli("serve", "--port", "0", "--db", "mysql://db/x"))
    assert "SQLite or PostgreSQL" in err


def test_unwritable_database_directory_is_one_line_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # works as root too, unlike chmod
    err = _one_line_error(_cli("serve", "--port", "0", "--db", f"sqlite:///{blocker / 'sub' / 'gw.db'}"))
    assert str(blocker / "sub") in err and "--db" in err
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        err = _one_line_error(_cli("serve", "--port", "0", "--db", f"sqlite:///{locked / 'gw.db'}"))
        assert "not writable" in err and str(locked) in err


def test_ctrl_c_on_serve_exits_quietly(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gradwatch_server.cli",
            "serve",
            "--port",
            str(port),
            "--db",
            f"sqlite:///{tmp_path / 'c.db'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode in (0, 130), out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


def test_docs_command_table_is_generated_from_the_registry():
    """docs/cli.md's table is the registry's; every registered command has a handler and a --help line."""
    import re
    from pathlib import Path

    from gradwatch_server.cli import markdown_table, parser_and_helps
    from gradwatch_server.cli.commands import COMMANDS

    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    table = re.search(r"<!-- commands-table:start -->\n(.*)\n<!-- commands-table:end -->", text, re.S).group(1)
    assert table == markdown_table()
    parser, helps = parser_and_helps()
    assert len(helps) == len(COMMANDS) == len({c.run for c in COMMANDS})  # one parser and one handler each
    assert parser.parse_args(["gc", "--older-than", "1d"]).gradwatch_handler is COMMANDS[3].run
    assert all(f"`gradwatch {name}`" in text and line for name, line in helps.items())
