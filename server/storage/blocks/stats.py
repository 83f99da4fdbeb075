"""``gradwatch db stats``: where the disk goes, bytes per point by kind of block and per run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sqlalchemy import case, func, select, text

from gradwatch_server.storage import db


@dataclass
class Kind:
    """Blocks of one kind: rows, compressed rows, blob bytes, and the values they hold (or summarise)."""

    rows: int = 0
    encoded: int = 0
    bytes: int = 0
    values: int = 0


@dataclass
class Usage:
    kinds: dict = field(default_factory=dict)  # name -> Kind
    runs: list = field(default_factory=list)  # (run id, project, name, values, bytes), biggest first
    file_bytes: int | None = None  # the whole database (SQLite file or PostgreSQL database)
    free_bytes: int | None = None  # SQLite: free pages inside the file


def _blobs(conn, table, *extra):
    """Per key: rows, encoded rows and blob bytes of a block table."""
    t = table.c
    size = func.length(t.data)
    if table is db.chunks:
        size = size + func.length(t.steps) + func.length(t.walls) + func.coalesce(func.length(t.missing), 0)
    encoded = func.sum(case((func.length(t.data) % 8 == 5, 1), else_=0))
    query = select(t.key_id, func.count(), encoded, func.sum(size), *extra).group_by(t.key_id)
    return {row[0]: row[1:] for row in conn.execute(query)}


def collect(conn, top: int = 20) -> Usage:
    """Blob bytes by kind and per run (the ``top`` biggest runs), and the database's size."""
    k, r = db.metric_keys.c, db.runs.c
    keys = {row.id: row for row in conn.execute(select(k.id, k.run_id, k.layers))}
    slots = {key_id: len(json.loads(row.layers)) if row.layers else 1 for key_id, row in keys.items()}
    usage = Usage()
    per_run: dict = {}
    chunk_rows = _blobs(conn, db.chunks, func.sum(db.chunks.c.n))
    points = {key_id: int(row[3]) * slots.get(key_id, 1) for key_id, row in chunk_rows.items()}
    for name, rows in (
        ("chunks", chunk_rows),
        ("rollups", _blobs(conn, db.rollups)),
        ("heat rows", _blobs(conn, db.rollup_heat)),
    ):
        for key_id, (count, encoded, size, *_n) in rows.items():
            vector = slots.get(key_id, 1) > 1
            kind = usage.kinds.setdefault(f"{'vector' if vector else 'scalar'} {name}", Kind())
            kind.rows += count
            kind.encoded += int(encoded or 0)
            kind.bytes += int(size or 0)
            kind.values += points.get(key_id, 0)
            run_id = keys[key_id].run_id if key_id in keys else None
            run = per_run.setdefault(run_id, [0, 0])
            run[0] += points.get(key_id, 0) if name == "chunks" else 0
            run[1] += int(size or 0)
    names = {row.id: (row.project, row.name) for row in conn.execute(select(r.id, r.project, r.name))}
    ranked = sorted(per_run.items(), key=lambda item: -item[1][1])[:top]
    usage.runs = [(run_id, *names.get(run_id, ("?", "(keys of a deleted run)")), v, b) for run_id, (v, b) in ranked]
    usage.file_bytes, usage.free_bytes = _database_size(conn)
    return usage


def _database_size(conn) -> tuple:
    if conn.dialect.name == "postgresql":
        return conn.execute(text("SELECT pg_database_size(current_database())")).scalar(), None
    page = conn.exec_driver_sql("PRAGMA page_size").scalar()
    count = conn.exec_driver_sql("PRAGMA page_count").scalar()
    free = conn.exec_driver_sql("PRAGMA freelist_count").scalar()
    return page * count, page * free


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def report(usage: Usage) -> str:
    """The table ``gradwatch db stats`` prints."""
    lines = []
    if usage.file_bytes is not None:
        free = f", {_mb(usage.free_bytes)} of it free pages" if usage.free_bytes else ""
        lines.append(f"database: {_mb(usage.file_bytes)}{free}")
    lines.append(f"{'blocks':<22}{'rows':>10}{'compressed':>12}{'bytes':>14}{'values':>14}{'bytes/value':>13}")
    for name, kind in sorted(usage.kinds.items()):
        per = f"{kind.bytes / kind.values:.2f}" if kind.values else "-"
        lines.append(f"{name:<22}{kind.rows:>10,}{kind.encoded:>12,}{kind.bytes:>14,}{kind.values:>14,}{per:>13}")
    lines.append(
        "(rollups and heat rows: bytes per value of the points they summarise; row and index overhead not counted)"
    )
    lines.append("")
    lines.append(f"{'run':>7}  {'project / name':<40}{'values':>14}{'bytes':>14}{'bytes/value':>13}")
    for run_id, project, name, values, size in usage.runs:
        per = f"{size / values:.2f}" if values else "-"
        label = f"{project} / {name}"[:39]
        lines.append(f"{run_id if run_id is not None else '-':>7}  {label:<40}{values:>14,}{size:>14,}{per:>13}")
    return "\n".join(lines)
