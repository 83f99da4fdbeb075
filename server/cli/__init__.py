"""The ``gradwatch`` command: its parser and dispatch, built from the registry in ``cli/commands.py``.

Anything a user can get wrong at start (a busy port, a bad --db, a database directory that cannot
be written) ends in one line that names the thing and the fix, never a traceback.
"""

from __future__ import annotations

import argparse
import sys


def version() -> str:
    try:
        from importlib.metadata import version as dist_version

        return dist_version("gradwatch")
    except Exception:  # running from a checkout that is not installed
        from gradwatch import __version__

        return __version__


class _Subcommands:
    """The subparsers as one command's ``add_parser`` sees them: records its help line and sets its handler."""

    def __init__(self, sub, handler):
        self.sub, self.handler, self.helps = sub, handler, {}

    def add_parser(self, name: str, **kwargs):
        self.helps[name] = kwargs.get("help", "")
        parser = self.sub.add_parser(name, **kwargs)
        parser.set_defaults(gradwatch_handler=self.handler)
        return parser


def parser_and_helps() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """The parser of every registered command (each subparser knows its handler) and each command's help line."""
    from gradwatch_server.cli.commands import COMMANDS

    parser = argparse.ArgumentParser(prog="gradwatch", description="Live training monitor for PyTorch.")
    parser.add_argument("--version", action="version", version=f"gradwatch {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    helps: dict[str, str] = {}
    for command in COMMANDS:
        recorder = _Subcommands(sub, command.run)
        command.add_parser(recorder)
        helps |= recorder.helps
    return parser, helps


def build_parser() -> argparse.ArgumentParser:
    return parser_and_helps()[0]


def main(argv: list[str] | None = None) -> None:
    """Parse, run the command; a problem it reports is one line on stderr and exit status 1."""
    from gradwatch_server.cli.source import SourceError, printable

    args = build_parser().parse_args(argv)
    try:
        sys.exit(args.gradwatch_handler(args))
    except SourceError as exc:
        print(printable(f"gradwatch {args.command}: {exc}"), file=sys.stderr)  # may quote a run's name
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"gradwatch {args.command}: interrupted", file=sys.stderr)
        sys.exit(130)


def markdown_table() -> str:
    """docs/cli.md's command table: every registered command with its ``--help`` line."""
    rows = [f"| `gradwatch {name}` | {text[0].upper() + text[1:]}. |" for name, text in parser_and_helps()[1].items()]
    return "\n".join(["| Command | What it does |", "|---|---|", *rows])
