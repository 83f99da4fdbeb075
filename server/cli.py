"""The ``gradwatch`` command: serve, demo, sync."""

from __future__ import annotations

import argparse
import sys

from .settings import SETTINGS, add_arguments, from_env


def _need_server_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import sqlalchemy  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        sys.exit(f"gradwatch: the server needs extra packages ({exc.name} is missing): "
                 "pip install 'gradwatch[server]'")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gradwatch", description="Live training monitor for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the dashboard and ingest server",
                           description="Run the gradwatch server. Every flag also reads a GRADWATCH_* env var.")
    add_arguments(serve)
    demo = sub.add_parser("demo", help="start a server and stream real demo training runs into it")
    add_arguments(demo)
    demo.add_argument("--steps", type=int, default=600, help="training steps per demo run [600]")
    demo.add_argument("--delay", type=float, default=0.05, help="seconds to sleep per step, to watch it live")
    demo.add_argument("--exit", action="store_true", help="exit when the demo runs end instead of serving on")
    sync = sub.add_parser("sync", help="deliver batches a run left on disk when the server was unreachable")
    sync.add_argument("spool_dir", help="the directory printed by the run")
    sync.add_argument("--server", default=None, help="server address [$GRADWATCH_SERVER or http://127.0.0.1:8765]")
    return parser


def _settings(args):
    values = {s.name: getattr(args, s.name, None) for s in SETTINGS}
    try:
        return from_env(**values)
    except ValueError as exc:
        sys.exit(f"gradwatch: {exc}")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "sync":
        from .sync import sync

        sys.exit(sync(args.spool_dir, args.server))
    _need_server_extra()
    settings = _settings(args)
    if args.command == "serve":
        from .serve import serve_forever

        serve_forever(settings)
    else:
        from .demo import run_demo

        run_demo(settings, steps=args.steps, delay=args.delay, keep_serving=not args.exit)


if __name__ == "__main__":
    main()
