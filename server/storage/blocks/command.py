"""``gradwatch db compact`` and ``gradwatch db stats``: their flags and what they print (cli/admin.py hooks them in)."""

from __future__ import annotations

import sys
import time


def add_parsers(actions, db_flag) -> None:
    """The two subcommands, on ``gradwatch db``'s subparsers (``db_flag`` adds the shared --db)."""
    compact = actions.add_parser(
        "compact",
        help="rewrite old blocks compressed, online and resumable; then give the space back",
        description="Rewrite chunk and rollup blocks stored by an older release in the compressed form and "
        "merge each key's small rows (and a wide vector's 16-step full chunks of releases before 0009 into 64-step ones). A server may keep running on the database: each key is a short "
        "transaction. Stopped halfway, it resumes where it stopped. At the end the file shrinks "
        "(SQLite: incremental vacuum, after one VACUUM that switches the file to it; PostgreSQL: VACUUM).",
    )
    db_flag(compact)
    compact.add_argument("--run", type=int, default=None, metavar="ID", help="only this run")
    compact.add_argument(
        "--no-vacuum",
        action="store_true",
        help="leave the freed pages in the file (reused by new data) instead of giving them back; "
        "on SQLite the first give-back is one VACUUM, during which the server's writes wait",
    )
    stats = actions.add_parser("stats", help="bytes per point by kind of block and per run, biggest runs first")
    db_flag(stats)
    stats.add_argument("--top", type=int, default=20, metavar="N", help="list the N biggest runs [20]")


def compact(args, url: str) -> int:
    from gradwatch_server.storage import database
    from gradwatch_server.storage.blocks import compact as compaction

    database.make_engine(url).dispose()  # the schema current first (an older release then refuses the file)
    start = time.monotonic()
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    done = compaction.compact(url, args.run, progress=_bar, say=say, vacuum=not args.no_vacuum)
    saved = done.bytes_before - done.bytes_after
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(
        f"gradwatch: compacted {done.keys:,} keys in {time.monotonic() - start:.1f} s: {done.chunks:,} chunk rows "
        f"rewritten ({done.merged:,} small rows merged, {done.rechunked:,} old full chunks merged into bigger ones), "
        f"{done.rollups:,} rollup rows, {done.slimmed:,} vector summaries made lean, "
        f"{done.dropped:,} rollup rows of unread levels dropped; "
        f"{done.bytes_before / 1e6:,.1f} MB -> {done.bytes_after / 1e6:,.1f} MB ({saved / 1e6:,.1f} MB saved)"
    )
    return 0


def _bar(done: int, total: int) -> None:
    if not sys.stderr.isatty():  # a log file gets the summary line only
        return
    frac = done / total if total else 1.0
    filled = int(30 * min(1.0, frac))
    sys.stderr.write(
        f"\r[{'#' * filled}{' ' * (30 - filled)}] {100 * min(1.0, frac):3.0f} % {done:,}/{total:,} old chunks"
    )
    sys.stderr.flush()


def stats(args, url: str) -> int:
    from gradwatch_server.storage.blocks import stats as usage
    from gradwatch_server.storage.database import connect

    engine = connect(url)
    try:
        with engine.connect() as conn:
            print(usage.report(usage.collect(conn, args.top)))
    finally:
        engine.dispose()
    return 0


ACTIONS = {"compact": compact, "stats": stats}
