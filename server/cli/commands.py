"""Every ``gradwatch`` command, in ``--help`` order: one module each (its parser and its handler), one line here.

A command's module has ``add_parser(subparsers)`` (adds the command's parser with its help) and a handler
``run(args) -> exit status``; nothing else needs to know it exists (``gradwatch --help``, the dispatch and the
command table of docs/cli.md are derived from this list).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gradwatch_server.cli import audit, db, demo, export, gc, import_tb, report, runs, serve, sync, token


class Command(NamedTuple):
    """One subcommand: what adds its parser and what runs it."""

    add_parser: Callable
    run: Callable


COMMANDS = (
    Command(serve.add_parser, serve.run),
    Command(demo.add_parser, demo.run),
    Command(sync.add_parser, sync.run),
    Command(gc.add_parser, gc.run),
    Command(db.add_parser, db.run),
    Command(runs.add_parser, runs.run_runs),
    Command(export.add_parser, export.run_export),
    Command(import_tb.add_parser, import_tb.run_import),
    Command(report.add_parser, report.run_report),
    Command(token.add_parser, token.run),
    Command(audit.add_parser, audit.run),
)
