"""``gradwatch runs ls|rm``, and the wiring of the data commands (runs, export, import-tb, report) into the CLI."""

from __future__ import annotations

import json
import sys

from gradwatch.contract import STATUSES, options
from gradwatch_server.cli.source import SourceError, open_source, printable, resolve

COMMANDS = ("runs", "export", "import-tb", "report")


def add_parsers(sub) -> None:
    """Add every data command to the ``gradwatch`` parser."""
    from gradwatch_server.cli import export, import_tb, report

    runs = sub.add_parser(
        "runs", help="list or delete runs", description="List or delete runs on a server (or a database with --db)."
    )
    actions = runs.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("ls", help="list runs, newest first")
    ls.add_argument("--project")
    ls.add_argument("--status", choices=STATUSES)
    ls.add_argument("--json", action="store_true", help="print the runs as JSON (the /api/runs form)")
    ls.add_argument("--where", help="filter, e.g. 'config.lr < 1e-3 and summary.val/loss.min < 0.5' (docs/api.md)")
    ls.add_argument("--order-by", help="sort fields, comma-separated, '-' for descending: -summary.acc.max")
    ls.add_argument("--columns", help="config keys and summaries to show: config.lr,summary.loss.min")
    ls.add_argument("--limit", type=int, help="at most this many runs")
    export.add_source_arguments(ls)
    rm = actions.add_parser("rm", help="delete runs with all their points and alerts")
    rm.add_argument("runs", nargs="+", help="run ids, or names that each match one run")
    rm.add_argument("-y", "--yes", action="store_true", help="do not ask (needed when not on a terminal)")
    rm.add_argument("--json", action="store_true", help='print {"deleted": [ids]}')
    export.add_source_arguments(rm)
    export.add_parser(sub)
    import_tb.add_parser(sub)
    report.add_parser(sub)


def main(args) -> int:
    """Run one data command; a problem is one line on stderr and exit status 1."""
    from gradwatch_server.cli import export, import_tb, report

    handlers = {
        "runs": run_runs,
        "export": export.run_export,
        "import-tb": import_tb.run_import,
        "report": report.run_report,
    }
    try:
        return handlers[args.command](args)
    except SourceError as exc:
        print(printable(f"gradwatch {args.command}: {exc}"), file=sys.stderr)  # may quote a run's name
        return 1
    except KeyboardInterrupt:
        print(f"gradwatch {args.command}: interrupted", file=sys.stderr)
        return 130


def run_runs(args) -> int:
    source = open_source(args)
    try:
        return _ls(source, args) if args.action == "ls" else _rm(source, args)
    finally:
        source.close()


def _ls(source, args) -> int:
    query = {"where": args.where, "order_by": args.order_by, "columns": args.columns, "limit": args.limit}
    runs = source.runs(project=args.project, status=args.status, **{k: v for k, v in query.items() if v})
    extra = column_names(args.columns)
    if args.json:
        print(json.dumps(runs, indent=1))
        return 0
    rows = [("ID", "PROJECT", "NAME", "STATUS", "STEP", "ALERTS", *[name.upper() for name in extra])]
    rows += [
        (
            str(r["id"]),
            r["project"],
            r["name"],
            r["status"],
            "" if r["last_step"] is None else str(r["last_step"]),
            str(r["alert_count"]),
            *[cell(r, name) for name in extra],
        )
        for r in runs
    ]
    rows = [tuple(printable(cell) for cell in row) for row in rows]  # names may hold terminal escapes
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())  # cells made printable above
    return 0


column_names = options.column_names  # the ``--columns`` names as given (commas inside ``at_min(...)`` do not split)


def cell(run: dict, name: str) -> str:
    """One ``--columns`` value of a run as text: config.<key> or summary.<key>.<field>."""
    kind, *path = options.parse_column(name)
    if kind == "config":
        value = run.get("config", {})
        for part in path[0].split("."):
            value = value.get(part) if isinstance(value, dict) else None
    elif kind == "summary":
        value = run.get("summary", {}).get(path[0], {}).get(path[1])
    else:
        value = run.get(path[0])
    return "" if value is None else str(value)


def _rm(source, args) -> int:
    ids = [resolve(source, ref) for ref in args.runs]
    runs = [source.run(i) for i in ids]  # every one exists before any is deleted
    if not args.yes:
        if not sys.stdin.isatty():
            raise SourceError(f"would delete {len(ids)} run(s) ({', '.join(map(str, ids))}): pass --yes to confirm")
        names = ", ".join(f"{r['id']} {r['name']!r}" for r in runs)
        if input(f"Delete {names} with all their data? [y/N] ").strip().lower() not in ("y", "yes"):
            print("gradwatch runs rm: nothing deleted", file=sys.stderr)
            return 1
    for run_id in ids:
        source.delete(run_id)
    print(json.dumps({"deleted": ids}) if args.json else f"deleted {len(ids)} run(s): {', '.join(map(str, ids))}")
    return 0
