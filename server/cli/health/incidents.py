"""``gradwatch incidents [RUN | --project P] [--open] [--json]``: a run's incidents (or a project's) in the terminal."""

from __future__ import annotations

import json

from gradwatch_server.cli.source import open_source, printable, resolve

# The fields of one incident in --json, in this order (docs/cli.md): stable, whatever the API adds.
FIELDS = ("id", "run_id", "run_name", "project", "kind", "severity", "status", "first_step", "last_step")
FIELDS += ("story", "cause", "message")


def add_parser(sub) -> None:
    from gradwatch_server.cli import export

    p = sub.add_parser(
        "incidents",
        help="list a run's (or a project's) incidents: story, cause, steps, status",
        description="A run's incidents, one a line (story, cause, first/last step, status); without RUN, every "
        "run's (the inbox), open first.",
    )
    p.add_argument("run", nargs="?", help="a run id, or a name that matches one run (default: every run)")
    p.add_argument("--project", help="only this project's runs (without RUN)")
    p.add_argument("--open", action="store_true", help="only incidents that need a look (status open)")
    p.add_argument("--json", action="store_true", help="print a JSON list (fields: docs/cli.md#incidents)")
    export.add_source_arguments(p)


def brief(inc: dict, run: dict | None = None) -> dict:
    """One incident in the --json form: FIELDS, the root alert's message as ``message``."""
    root = inc.get("root") or {}
    out = {**inc, "message": root.get("message")}
    if run is not None:
        out["run_name"], out["project"] = run["name"], run["project"]
    return {name: out.get(name) for name in FIELDS}


def line(inc: dict) -> str:
    """'#3 run 7 "name" open critical steps 1-4: diverged at 1 → loss NaN at 4 (cause: ...)'."""
    steps = _steps(inc["first_step"], inc["last_step"])
    text = f"#{inc['id']}  {inc['status']:<12} {inc['severity']:<8} run {inc['run_id']} {inc['run_name']!r}  {steps}"
    text += f"  {inc['story']}"
    if inc["cause"]:
        text += f"  (cause: {inc['cause']})"
    return printable(text)


def _steps(first, last) -> str:
    if first is None:
        return "step ?"
    return f"step {first}" if last in (None, first) else f"steps {first}-{last}"


def run(args) -> int:
    source = open_source(args)
    try:
        if args.run:
            run_id = resolve(source, args.run)
            meta = source.run(run_id)
            found = [brief(i, meta) for i in source.incidents(run_id)]
            if args.open:  # a run's list has no status filter of its own; it is short
                found = [i for i in found if i["status"] == "open"]
        else:  # the inbox filters before its limit, so no open incident is cut off by newer closed ones
            found = [brief(i) for i in source.inbox(project=args.project, status="open" if args.open else None)]
    finally:
        source.close()
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    if not found:
        print("no incidents" + (" open" if args.open else ""))
    for inc in found:
        print(line(inc))
    return 0
