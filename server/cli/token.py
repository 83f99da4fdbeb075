"""``gradwatch token create|ls|revoke``: named tokens with a role, on the database (``--db``), server running or not."""

from __future__ import annotations

import json
import sys
import time

from gradwatch_server.cli.admin import connection, database_url, db_flag, reporting, utc
from gradwatch_server.cli.source import print_table


def add_parser(sub) -> None:
    p = sub.add_parser(
        "token",
        help="create, list or revoke named tokens (roles ingest, viewer, editor, admin)",
        description="Named tokens for the server, each with a role (ingest: stream runs; viewer: read; editor: "
        "also edit runs and incidents; admin: everything), optionally limited to projects and with an expiry. "
        "Stored hashed: the secret is printed once, at creation. Revoking ends the token's sessions.",
    )
    actions = p.add_subparsers(dest="token_command", required=True)
    create = actions.add_parser("create", help="make a token and print its secret (once)")
    create.add_argument("--name", required=True, help="who or what uses it, e.g. box-12 or ana")
    create.add_argument("--role", required=True, choices=("ingest", "viewer", "editor", "admin"))
    create.add_argument("--project", action="append", help="limit it to this project (repeat for more) [every project]")
    create.add_argument("--expires", metavar="AGE", help="valid for this long, e.g. 90d, 12h [no expiry]")
    create.add_argument("--json", action="store_true", help="print the token (with its secret) as JSON")
    db_flag(create)
    ls = actions.add_parser("ls", help="list the tokens (never their secrets)")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    db_flag(ls)
    revoke = actions.add_parser("revoke", help="revoke a token: it and its sessions stop working (other servers: 30 s)")
    revoke.add_argument("name")
    db_flag(revoke)


def run(args) -> int:
    url = database_url(args)
    with reporting(url):
        return {"create": _create, "ls": _ls, "revoke": _revoke}[args.token_command](args, url)


def _create(args, url: str) -> int:
    from gradwatch_server.storage import retention
    from gradwatch_server.web import audit, tokens

    try:
        expires = None if args.expires is None else time.time() + retention.parse_duration(args.expires)
    except ValueError as exc:
        sys.exit(f"gradwatch: --expires {exc}")
    try:
        with connection(url, write=True) as conn:
            made = tokens.create(conn, args.name, args.role, args.project, expires, by="cli")
            audit.record(conn, "cli", "admin", f"token create {made['name']}", 200, detail={"role": made["role"]})
    except ValueError as exc:
        sys.exit(f"gradwatch token create: {exc}")
    if args.json:
        print(json.dumps(made, indent=1))
        return 0
    where = ", ".join(made["projects"]) if made["projects"] else "every project"
    print(f"gradwatch: token {made['name']!r} (role {made['role']}, {where}) created; its secret, shown only now:")
    print(made["secret"])
    return 0


def _ls(args, url: str) -> int:
    from gradwatch_server.web import tokens

    with connection(url) as conn:
        rows = tokens.listing(conn)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = [("NAME", "ROLE", "PROJECTS", "EXPIRES", "LAST USED")]
    for r in rows:
        expires = "-" if r["expires_at"] is None else ("expired" if r["expired"] else utc(r["expires_at"]))
        used = "never" if r["last_used_at"] is None else utc(r["last_used_at"])
        table.append((r["name"], r["role"], ",".join(r["projects"] or ["*"]), expires, used))
    print_table(table)
    return 0


def _revoke(args, url: str) -> int:
    from gradwatch_server.web import audit, sessions, tokens

    with connection(url, write=True) as conn:
        key = conn.execute(tokens.select_digest(args.name)).scalar()
        if key is None:
            sys.exit(f"gradwatch token revoke: no token named {args.name!r} (see gradwatch token ls)")
        sessions.end_of_token(conn, key)
        tokens.revoke(conn, args.name)
        audit.record(conn, "cli", "admin", f"token revoke {args.name}", 200)
    print(f"gradwatch: token {args.name!r} revoked (a server stops taking it within 30 s)")
    return 0
