"""``gradwatch gc``: delete runs not updated for a while (retention), with or without a server on the database."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from gradwatch_server.cli.admin import database_url, db_flag, describe, reporting, utc


def add_parser(sub) -> None:
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
    db_flag(gc)


def run(args) -> int:
    url = database_url(args)
    with reporting(url):
        return gc(args, url)


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
    when = f"last updated before {utc(cutoff)} (older than {args.older_than})"
    if not runs:
        print(f"gradwatch gc: no run to delete: none {when}{' without a tag' if args.keep_tagged else ''}")
    else:
        tail = "; nothing deleted (--dry-run)" if args.dry_run else ""
        print(f"gradwatch gc: {verb} {len(runs)} run(s), {points:,} points, {when}{tail}")
    return 0
