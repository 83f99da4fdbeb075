"""What the maintenance commands (``gc``, ``db``) share: the ``--db`` flag, its URL, one-line database errors.

Each works on the database named by ``--db`` (or GRADWATCH_DB, or the default SQLite file), with
or without a server running on it, and ends in one readable line on failure, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from gradwatch_server.cli.serve import need_server_extra, redacted
from gradwatch_server.cli.source import printable


def db_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", default=None, help="database URL [env GRADWATCH_DB; default the SQLite file of `gradwatch serve`]"
    )


def database_url(args) -> str:
    """The database of ``--db`` / GRADWATCH_DB / the default; exits with one line when the server extra is missing."""
    need_server_extra()
    from gradwatch_server.settings import from_env

    try:
        return from_env(db=args.db).db_url
    except ValueError as exc:
        sys.exit(f"gradwatch: {exc}")


@contextlib.contextmanager
def reporting(url: str):
    """A database error inside: one line naming the database (without its password), never a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except SQLAlchemyError as exc:
        sys.exit(f"gradwatch: cannot use the database {redacted(url)}: {first_line(exc)} (check --db)")


@contextlib.contextmanager
def connection(url: str, write: bool = False):
    """A connection to the database at its newest schema (created or upgraded, as `gradwatch serve` does at start);
    with ``write``, one transaction committed at the end. The engine is disposed of either way."""
    from gradwatch_server.storage import database

    engine = database.make_engine(url)
    try:
        with engine.begin() if write else engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def describe(run: dict) -> str:
    tags = f", tags {', '.join(map(str, run['tags']))}" if run["tags"] else ""
    return printable(  # names and tags may hold terminal escapes
        f"run {run['id']} {run['project']}/{run['name']} ({run['status']}, last update "
        f"{utc(run['updated_at'])}, {run['points']:,} points{tags})"
    )


def utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


def first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
