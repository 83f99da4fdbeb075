"""Maintenance commands: ``gradwatch gc`` (retention) and ``gradwatch db upgrade|status|wait|compact|stats``.

Each works on the database named by ``--db`` (or GRADWATCH_DB, or the default SQLite file), with
or without a server running on it, and ends in one readable line on failure, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from gradwatch_server.cli.source import printable

EXIT_NEEDS_UPGRADE = 3  # `gradwatch db status`: reachable, but older than this release


def add_parsers(sub) -> None:
    """The gc and db subcommands, on the ``gradwatch`` parser's subparsers."""
    gc = sub.add_parser(
        "gc",
        help="delete runs not updated for a while (retention)",
        description="Delete runs whose last update is older than --older-than, with all their points and alerts. "
        "Running and stalled runs are never deleted. Big runs are deleted in short slices, so a "
        "server ingesting into the same database is not held up. The server can do this by itself "
        "every hour: --retention-days / GRADWATCH_RETENTION_DAYS.",
    )
    gc.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 90d, 12h, 30m, 2w")
    gc.add_argument("--keep-tagged", action="store_true", help="keep runs that have at least one tag")
    gc.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    gc.add_argument("--json", action="store_true", help="print the result as JSON")
    _db_flag(gc)
    dbp = sub.add_parser(
        "db",
        help="database schema: upgrade, status, wait",
        description="The database schema. `gradwatch serve` upgrades an older database by itself "
        "at start; these do it (or check it) without starting a server.",
    )
    actions = dbp.add_subparsers(dest="db_command", required=True)
    _db_flag(actions.add_parser("upgrade", help="bring the database up to this release's schema (in place)"))
    _db_flag(
        actions.add_parser(
            "status",
            help=f"say whether the database is current (exit {EXIT_NEEDS_UPGRADE}: it needs `gradwatch db upgrade`)",
        )
    )
    wait = actions.add_parser("wait", help="wait until the database answers (used by the Docker image)")
    _db_flag(wait)
    wait.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds [60]")
    from gradwatch_server.storage.blocks import command  # compact and stats: logic and flags live there

    command.add_parsers(actions, _db_flag)


def _db_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", default=None, help="database URL [env GRADWATCH_DB; default the SQLite file of `gradwatch serve`]"
    )


def main(args) -> int:
    """Run ``gc`` or ``db ...``; the exit status."""
    from sqlalchemy.exc import SQLAlchemyError

    from gradwatch_server.settings import from_env

    try:
        url = from_env(db=args.db).db_url
    except ValueError as exc:
        sys.exit(f"gradwatch: {exc}")
    try:
        if args.command == "gc":
            return gc(args, url)
        from gradwatch_server.storage.blocks import command

        actions = {"upgrade": upgrade, "status": status, "wait": wait, **command.ACTIONS}
        return actions[args.db_command](args, url)
    except SQLAlchemyError as exc:
        sys.exit(f"gradwatch: cannot use the database {redacted(url)}: {first_line(exc)} (check --db)")


def gc(args, url: str) -> int:
    from gradwatch_server.storage import retention

    try:
        older_than = retention.parse_duration(args.older_than)
    except ValueError as exc:
        sys.exit(f"gradwatch: --older-than {exc}")
    now = time.time()
    verb = "would delete" if args.dry_run else "deleted"
    show = None if args.json else (lambda run: print(f"gradwatch: {verb} {describe(run)}", flush=True))
    services = retention.Offline(url)
    try:
        # A pause between slices lets a server sharing this (SQLite) file take the write lock in between.
        runs = asyncio.run(
            retention.collect(
                services, older_than, args.keep_tagged, args.dry_run, now=now, on_deleted=show, pause=0.02
            )
        )
    finally:
        services.close()
    cutoff = now - older_than
    points = sum(r["points"] for r in runs)
    if args.json:
        print(
            json.dumps(
                {
                    "older_than": args.older_than,
                    "cutoff": cutoff,
                    "keep_tagged": args.keep_tagged,
                    "dry_run": args.dry_run,
                    "runs": runs,
                    "count": len(runs),
                    "points": points,
                },
                indent=2,
            )
        )
        return 0
    if args.dry_run:
        for run in runs:
            show(run)
    when = f"last updated before {_utc(cutoff)} (older than {args.older_than})"
    if not runs:
        print(f"gradwatch gc: no run to delete: none {when}{' without a tag' if args.keep_tagged else ''}")
    else:
        tail = "; nothing deleted (--dry-run)" if args.dry_run else ""
        print(f"gradwatch gc: {verb} {len(runs)} run(s), {points:,} points, {when}{tail}")
    return 0


def describe(run: dict) -> str:
    tags = f", tags {', '.join(map(str, run['tags']))}" if run["tags"] else ""
    return printable(  # names and tags may hold terminal escapes
        f"run {run['id']} {run['project']}/{run['name']} ({run['status']}, last update "
        f"{_utc(run['updated_at'])}, {run['points']:,} points{tags})"
    )


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


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


def first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL: say it as given
        return url
