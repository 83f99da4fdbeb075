"""``gradwatch audit``: the audit log (who did what, when), newest first, from the database (``--db``)."""

from __future__ import annotations

import json

from gradwatch_server.cli.admin import connection, database_url, db_flag, reporting, utc
from gradwatch_server.cli.source import printable


def add_parser(sub) -> None:
    p = sub.add_parser(
        "audit",
        help="show the audit log: who (token) did what, when",
        description="Every write through the API (rules, channels, run edits, deletes, incident status), every "
        "login and token change, with the token's name and role and the answer's status; newest first.",
    )
    p.add_argument("--limit", type=int, default=50, help="at most this many entries [50]")
    p.add_argument("--who", help="only this token's entries")
    p.add_argument("--project", help="only this project's entries")
    p.add_argument("--json", action="store_true", help="print the entries as JSON (the /api/audit form)")
    db_flag(p)


def run(args) -> int:
    from gradwatch_server.web import audit

    url = database_url(args)
    with reporting(url), connection(url) as conn:
        rows = audit.listing(conn, args.limit, args.who, args.project)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        status = "" if r["status"] is None else f" -> {r['status']}"
        print(printable(f"{utc(r['at'])}  {r['who']} ({r['role']})  {r['action']}{status}"))
    return 0
