"""Where the data commands (export, report, runs) read runs from: a server's HTTP API or, with
``--db``, the database itself through ``store`` (no server needed). Plus stderr progress lines."""

from __future__ import annotations

import os
import re
import sys
import time

from gradwatch import api, protocol


class SourceError(RuntimeError):
    """A run that does not exist, a server that does not answer: one line for the user."""


class HttpSource:
    """The JSON API of a running server (token from --token or $GRADWATCH_TOKEN)."""

    def __init__(self, server: str | None = None, token: str | None = None):
        self.base = (server or os.environ.get("GRADWATCH_SERVER") or protocol.DEFAULT_SERVER).rstrip("/")
        self.token = token or os.environ.get("GRADWATCH_TOKEN") or None

    def _call(self, method: str, path: str, **query):
        try:
            return api.call(self.base, self.token, method, path, **query)
        except api.ApiError as exc:
            if exc.status is not None:
                raise SourceError(f"{self.base}: {exc.reason} (HTTP {exc.status})") from None
            raise SourceError(
                f"cannot reach the gradwatch server at {self.base} ({exc.reason}): "
                "start it with `gradwatch serve`, pass --server URL, or read a database with --db"
            ) from None

    def runs(self, project=None, status=None, **query):  # query: where, order_by, columns, limit
        return self._call("GET", "/api/runs", project=project, status=status, **query)

    def run(self, run_id: int):
        return self._call("GET", f"/api/runs/{run_id}")

    def keys(self, run_id: int):
        return self._call("GET", f"/api/runs/{run_id}/keys")

    def series(self, run_id: int, key: str, max_points: int | None = None):
        return self._call("GET", f"/api/runs/{run_id}/series", key=key, max_points=max_points)

    def alerts(self, run_id: int):
        return self._call("GET", f"/api/runs/{run_id}/alerts")

    def incidents(self, run_id: int):
        return self._call("GET", f"/api/runs/{run_id}/incidents")

    def inbox(self, project=None, status=None):
        return self._call("GET", "/api/incidents", project=project, status=status)

    def delete(self, run_id: int):
        return self._call("DELETE", f"/api/runs/{run_id}")

    def close(self):
        pass


class DbSource:
    """The database itself, read through ``store`` (and ``edits`` for deletes)."""

    def __init__(self, url: str):
        from gradwatch_server.storage import database

        self.engine = database.make_engine(url)

    def _read(self, fn, *args, **kwargs):
        from gradwatch_server.storage.store import NotFound

        try:
            with self.engine.connect() as conn:
                return fn(conn, *args, **kwargs)
        except NotFound as exc:
            raise SourceError(str(exc)) from None

    def runs(self, project=None, status=None, **query):  # query: where, order_by, columns, limit
        from gradwatch_server.storage import store
        from gradwatch_server.storage.query import QueryError

        try:
            return self._read(store.list_runs, project=project, status=status, **query)
        except QueryError as exc:
            raise SourceError(str(exc)) from None

    def run(self, run_id: int):
        from gradwatch_server.storage import store

        return self._read(store.get_run, run_id)

    def keys(self, run_id: int):
        from gradwatch_server.storage import store

        return self._read(store.list_keys, run_id)

    def series(self, run_id: int, key: str, max_points: int | None = None):
        from gradwatch_server.storage import store

        return self._read(store.get_series, run_id, key, max_points)

    def alerts(self, run_id: int):
        from gradwatch_server.storage import store

        return self._read(store.get_alerts, run_id)

    def incidents(self, run_id: int):
        from gradwatch_server.health import incidents

        return self._read(incidents.list_incidents, run_id)

    def inbox(self, project=None, status=None):
        from gradwatch_server.health import incidents

        return self._read(incidents.inbox, project, status)

    def delete(self, run_id: int):
        from gradwatch_server.storage import edits, store

        self._read(store.get_run, run_id)
        with self.engine.begin() as conn:
            edits.delete_run(conn, run_id)
        return {"deleted": run_id}

    def close(self):
        self.engine.dispose()


def open_source(args):
    """--db URL reads the database; otherwise the server at --server / $GRADWATCH_SERVER."""
    if getattr(args, "db", None):
        return DbSource(args.db)
    return HttpSource(getattr(args, "server", None), getattr(args, "token", None))


def resolve(source, ref: str) -> int:
    """A run id, or a run name that matches exactly one run."""
    if ref.isdigit():
        return int(ref)
    matches = [r for r in source.runs() if r["name"] == ref]
    if len(matches) != 1:
        ids = ", ".join(str(r["id"]) for r in matches)
        raise SourceError(
            f"no run named {ref!r}" if not matches else f"{len(matches)} runs are named {ref!r} (ids {ids}): give an id"
        )
    return matches[0]["id"]


def decode(values: list) -> list:
    """API values as floats: "NaN"/"Infinity"/"-Infinity" back to floats, null (no gradient) kept as None."""
    return [protocol.decode_float(v) for v in values]


# C0 and C1 controls, DEL and the bidi overrides: what lets a name in a run retitle a terminal, colour
# it, move the cursor, start a forged row or read backwards.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text) -> str:
    """Text from a run (names, keys, tags) safe to print on a terminal: controls shown as escapes."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))


def print_table(rows: list[tuple]) -> None:
    """Rows (the first the header) as columns aligned with two spaces; every cell made printable."""
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


class Progress:
    """A progress line on stderr, rewritten in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, what: str, total: int, stream=None):
        self.what, self.total, self.done = what, total, 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._last = 0.0

    def step(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if self.done >= self.total or now - self._last >= (0.1 if self.tty else 2.0):
            self._last = now
            line = printable(f"gradwatch: {self.what} {self.done}/{self.total}{' ' + note if note else ''}")
            self.stream.write(("\r" + line + "\033[K") if self.tty else line + "\n")
            if self.tty and self.done >= self.total:
                self.stream.write("\n")
            self.stream.flush()
