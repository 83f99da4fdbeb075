"""``gradwatch db upgrade|status|wait|compact|stats``: the schema checked or brought up to date, blocks compacted, disk use."""

from __future__ import annotations

import sys
import time

from gradwatch_server.cli.admin import database_url, db_flag, first_line, reporting
from gradwatch_server.cli.serve import redacted
from gradwatch_server.storage.blocks import command

EXIT_NEEDS_UPGRADE = 3  # `gradwatch db status`: reachable, but older than this release


def add_parser(sub) -> None:
    dbp = sub.add_parser(
        "db",
        help="database: schema upgrade, status, wait; compact, stats",
        description="The database schema. `gradwatch serve` upgrades an older database by itself "
        "at start; these do it (or check it) without starting a server.",
    )
    actions = dbp.add_subparsers(dest="db_command", required=True)
    db_flag(actions.add_parser("upgrade", help="bring the database up to this release's schema (in place)"))
    db_flag(
        actions.add_parser(
            "status",
            help=f"say whether the database is current (exit {EXIT_NEEDS_UPGRADE}: it needs `gradwatch db upgrade`)",
        )
    )
    wait = actions.add_parser("wait", help="wait until the database answers (used by the Docker image)")
    db_flag(wait)
    wait.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds [60]")
    command.add_parsers(actions, db_flag)  # compact and stats: their logic and flags live with the blocks


def run(args) -> int:
    url = database_url(args)
    with reporting(url):
        return {"upgrade": upgrade, "status": status, "wait": wait, **command.ACTIONS}[args.db_command](args, url)


def upgrade(args, url: str) -> int:
    from gradwatch_server.storage import database

    before = pending(url) if not url.startswith("sqlite") or _sqlite_file_exists(url) else ["a new database"]
    database.make_engine(url).dispose()  # upgrades in place (migrate.py), as `gradwatch serve` does at start
    after = pending(url)
    if after:
        sys.exit(f"gradwatch: {redacted(url)} is still not current after the upgrade: {'; '.join(after)}")
    print(
        f"gradwatch: {redacted(url)} upgraded ({'; '.join(before)})"
        if before
        else f"gradwatch: {redacted(url)} was already current; nothing to do"
    )
    return 0


def status(args, url: str) -> int:
    if url.startswith("sqlite") and not _sqlite_file_exists(url):
        print(f"gradwatch: {redacted(url)} does not exist yet; `gradwatch serve` creates it")
        return 0
    changes = pending(url)
    if not changes:
        print(f"gradwatch: {redacted(url)} is current")
        return 0
    print(
        f"gradwatch: {redacted(url)} needs `gradwatch db upgrade` (or a `gradwatch serve`, which upgrades at "
        f"start): {'; '.join(changes)}"
    )
    return EXIT_NEEDS_UPGRADE


def _sqlite_file_exists(url: str) -> bool:
    from pathlib import Path

    from sqlalchemy.engine import make_url

    path = make_url(url).database
    return not path or path == ":memory:" or Path(path).expanduser().exists()


def pending(url: str) -> list[str]:
    """What an upgrade would change (migrate.pending), read without changing anything."""
    from sqlalchemy import create_engine

    from gradwatch_server.storage import database, migrate

    engine = create_engine(database.driver_url(url))
    try:
        with engine.connect() as conn:
            return migrate.pending(conn)
    finally:
        engine.dispose()


def wait(args, url: str) -> int:
    """Until the database accepts a connection (PostgreSQL starting up), at most ``--timeout`` seconds."""
    if not url.startswith(("postgresql", "postgres:")):
        return 0  # SQLite: a file, nothing to wait for
    from sqlalchemy import create_engine, text

    from gradwatch_server.storage import database

    engine = create_engine(database.driver_url(url), connect_args={"connect_timeout": 5})
    deadline, said, last = time.monotonic() + args.timeout, False, None
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
                if said:
                    print(f"gradwatch: the database {redacted(url)} answers", file=sys.stderr, flush=True)
                return 0
            except Exception as exc:  # refused, unknown host, starting up: all mean wait
                last = first_line(exc)
            if time.monotonic() >= deadline:
                sys.exit(
                    f"gradwatch: the database {redacted(url)} did not answer within {args.timeout:g} s "
                    f"(last error: {last}); check GRADWATCH_DB and that PostgreSQL is running and reachable"
                )
            if not said:
                print(
                    f"gradwatch: waiting up to {args.timeout:g} s for the database {redacted(url)} ({last})",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(1.0)
    finally:
        engine.dispose()
