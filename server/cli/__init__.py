"""The ``gradwatch`` command: serve, demo, sync.

Anything a user can get wrong at start (a busy port, a bad --db, a database directory that cannot
be written) ends in one line that names the thing and the fix, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from gradwatch_server.settings import SETTINGS, add_arguments, from_env

DB_HINT = "use sqlite:///path/to/file.db or postgresql://user:password@host/dbname"


def _need_server_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import sqlalchemy  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        sys.exit(f"gradwatch: the server needs extra packages ({exc.name} is missing): pip install 'gradwatch[server]'")


def version() -> str:
    try:
        from importlib.metadata import version as dist_version

        return dist_version("gradwatch")
    except Exception:  # running from a checkout that is not installed
        from gradwatch import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gradwatch", description="Live training monitor for PyTorch.")
    parser.add_argument("--version", action="version", version=f"gradwatch {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the dashboard and ingest server",
        description="Run the gradwatch server. Every flag also reads a GRADWATCH_* env var.",
    )
    add_arguments(serve)
    demo = sub.add_parser(
        "demo",
        help="start a server and stream real demo training runs into it",
        description="Start a server and stream three real PyTorch training runs into it, a few seconds apart: "
        "two healthy ones and one whose learning rate ramps up until the loss diverges (and is "
        "flagged). Uses a database of its own (printed at start), not your default one; keeps "
        "serving after training until Ctrl-C.",
    )
    add_arguments(demo)
    demo.add_argument("--steps", type=int, default=6000, help="training steps per demo run [6000, ~5 minutes]")
    demo.add_argument("--delay", type=float, default=0.05, help="seconds to sleep per step, to watch it live [0.05]")
    demo.add_argument("--exit", action="store_true", help="exit when the demo runs end instead of serving on")
    sync = sub.add_parser("sync", help="deliver batches a run left on disk when the server was unreachable")
    sync.add_argument(
        "spool_dir",
        nargs="?",
        default=None,
        help="the directory printed by the run; without it, every pending run under the spool "
        "directory ($GRADWATCH_SPOOL_DIR or ~/.cache/gradwatch/spool)",
    )
    sync.add_argument("--server", default=None, help="server address [$GRADWATCH_SERVER or http://127.0.0.1:8765]")
    from gradwatch_server.cli.admin import add_parsers as add_admin_parsers

    add_admin_parsers(sub)  # gc, db upgrade|status|wait
    from gradwatch_server.cli.runs import add_parsers as add_data_parsers

    add_data_parsers(sub)  # runs ls|rm, export, import-tb, report
    return parser


def _settings(args):
    values = {s.name: getattr(args, s.name, None) for s in SETTINGS}
    try:
        return from_env(**values)
    except ValueError as exc:
        sys.exit(f"gradwatch: {exc}")


def check_database(url: str) -> str | None:
    """Why the database URL cannot work, in one line with the fix; None when it looks usable."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return f"--db {url!r} is not a database URL: {DB_HINT}"
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        return f"--db {url!r}: gradwatch stores runs in SQLite or PostgreSQL only: {DB_HINT}"
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    directory = Path(parsed.database).expanduser().resolve().parent
    fix = "pick another place with --db sqlite:///path/to/file.db or fix the permissions"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create the database directory {directory} ({exc.strerror or exc}): {fix}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"the database directory {directory} is not writable: {fix}"
    file = directory / Path(parsed.database).name
    if file.exists() and (not file.is_file() or not os.access(file, os.R_OK | os.W_OK)):
        return f"the database file {file} cannot be read and written: {fix}"
    return None


def _address_error(exc: OSError, settings) -> str:
    where = f"{settings.host}:{settings.port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {settings.port} on {settings.host} is already in use (another gradwatch serve?): stop that "
            "process or pick another port with --port N (--port 0 picks a free one)"
        )
    if exc.errno == errno.EACCES:
        return f"not allowed to listen on {where} (ports below 1024 need root): pick another port with --port N"
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or isinstance(exc, socket.gaierror):
        return (
            f"cannot listen on host {settings.host!r}: use an address of this machine with --host (127.0.0.1, 0.0.0.0)"
        )
    return f"cannot start the server on {where}: {exc.strerror or exc}"


def _start(args, settings) -> None:
    if args.command == "serve":
        from gradwatch_server.serve import serve_forever

        serve_forever(settings)
    else:
        from gradwatch_server.cli.demo import run_demo

        run_demo(settings, steps=args.steps, delay=args.delay, keep_serving=not args.exit)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "sync":
        from gradwatch_server.cli.sync import sync

        sys.exit(sync(args.spool_dir, args.server))
    from gradwatch_server.cli.runs import COMMANDS as DATA_COMMANDS
    from gradwatch_server.cli.runs import main as data_main

    if args.command in DATA_COMMANDS:
        sys.exit(data_main(args))
    _need_server_extra()
    if args.command in ("gc", "db"):
        from gradwatch_server.cli.admin import main as admin_main

        sys.exit(admin_main(args))
    settings = _settings(args)
    from sqlalchemy.exc import SQLAlchemyError

    problem = check_database(settings.db_url if args.command == "serve" or settings.db else _demo_db_url())
    if problem:
        sys.exit(f"gradwatch: {problem}")
    try:
        _start(args, settings)
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down cleanly, nothing to report
        print("gradwatch: stopped.", file=sys.stderr)
        sys.exit(130)
    except SQLAlchemyError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        sys.exit(f"gradwatch: cannot open the database {_redacted(settings.db_url)}: {first} (check --db)")
    except OSError as exc:
        sys.exit(f"gradwatch: {_address_error(exc, settings)}")


def _demo_db_url() -> str:
    from gradwatch_server.cli.demo import demo_db_path

    return f"sqlite:///{demo_db_path()}"


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url
