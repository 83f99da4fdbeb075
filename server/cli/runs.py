"""``gradwatch runs ls|rm``: list or delete runs on a server (or a database with --db)."""

from __future__ import annotations

import json
import sys

from gradwatch.contract import STATUSES, options
from gradwatch_server.cli.source import SourceError, open_source, print_table, resolve


def add_parser(sub) -> None:
    from gradwatch_server.cli import export

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
    rows = [("ID", "PROJECT", "NAME", "STATUS", "STEP", "ALERTS", "WORST OPEN", *[name.upper() for name in extra])]
    rows += [
        (
            str(r["id"]),
            r["project"],
            r["name"],
            r["status"],
            "" if r["last_step"] is None else str(r["last_step"]),
            str(r["alert_count"]),
            worst(r),
            *[cell(r, name) for name in extra],
        )
        for r in runs
    ]
    print_table(rows)  # names may hold terminal escapes: print_table makes every cell printable
    return 0


def worst(run: dict) -> str:
    """The run's worst open incident in a cell: 'critical loss_divergence @1 (+2 open)', '' when none."""
    inc = run.get("worst_incident")
    if not inc:
        return ""
    more = (run.get("open_incidents") or 1) - 1
    at = f" @{inc['first_step']}" if inc["first_step"] is not None else ""
    return f"{inc['severity']} {inc['kind']}{at}" + (f" (+{more} open)" if more > 0 else "")


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
