"""``gradwatch serve``: the dashboard, API and ingest server; and starting a server from the command line
(``serve``, ``demo``): settings, the checks before, one-line errors."""

from __future__ import annotations

import errno
import os
import socket
import sys
from pathlib import Path

from gradwatch_server.settings import SETTINGS, add_arguments, from_env

DB_HINT = "use sqlite:///path/to/file.db or postgresql://user:password@host/dbname"


def need_server_extra() -> None:
    """Exit with the pip line when the server's packages are missing."""
    try:
        import fastapi  # noqa: F401
        import sqlalchemy  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        sys.exit(f"gradwatch: the server needs extra packages ({exc.name} is missing): pip install 'gradwatch[server]'")


def settings_of(args):
    """The settings from the command's flags and GRADWATCH_* env vars; a bad value exits with one line."""
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


def address_error(exc: OSError, settings) -> str:
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


def launch(args, start, db_url) -> int:
    """Check, then ``start(settings)`` until it returns or Ctrl-C; ``db_url(settings)`` is the database it uses."""
    need_server_extra()
    settings = settings_of(args)
    from sqlalchemy.exc import SQLAlchemyError

    problem = check_database(db_url(settings))
    if problem:
        sys.exit(f"gradwatch: {problem}")
    try:
        start(settings)
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down cleanly, nothing to report
        print("gradwatch: stopped.", file=sys.stderr)
        return 130
    except SQLAlchemyError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        sys.exit(f"gradwatch: cannot open the database {redacted(settings.db_url)}: {first} (check --db)")
    except OSError as exc:
        sys.exit(f"gradwatch: {address_error(exc, settings)}")
    return 0


def redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL: say it as given
        return url


def add_parser(sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the dashboard and ingest server",
        description="Run the gradwatch server. Every flag also reads a GRADWATCH_* env var.",
    )
    add_arguments(serve)


def run(args) -> int:
    from gradwatch_server.serve import serve_forever

    return launch(args, serve_forever, lambda settings: settings.db_url)
