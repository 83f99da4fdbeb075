"""``gradwatch serve``: the dashboard, API and ingest server."""

from __future__ import annotations

from gradwatch_server.cli.launch import launch
from gradwatch_server.settings import add_arguments


def add_parser(sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the dashboard and ingest server",
        description="Run the gradwatch server. Every flag also reads a GRADWATCH_* env var.",
    )
    add_arguments(serve)


def run(args) -> int:
    from gradwatch_server.serve import serve_forever

    return launch(args, serve_forever, lambda settings: settings.db_url)
