"""Bringing a database written by an earlier release up to the current schema, in place, at start.

The steps are Alembic revisions (``server/storage/migrations/versions``); this module runs them and holds
the data conversion they call.

- 0.1 stored one row per point (``points``) and per vector step (``vectors``), and rollups with
  7 rows per block: its points are packed into chunks, the rollups rebuilt with wall times, and
  the old tables dropped (one transaction: a failure leaves the database as it was).
- New columns (alert counts and steps, run secrets) are added; on PostgreSQL step columns are
  widened to 64 bits.
"""

from __future__ import annotations

import json
import logging

import numpy as np
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.schema import CreateColumn

from gradwatch_server.storage import chunks, db, rollup_writes, summaries
from gradwatch_server.storage.blocks import rollup_cache

log = logging.getLogger("gradwatch.server")

UPGRADE_LOCK = 0x6772_6164  # "grad": the advisory lock id taken while upgrading
BASELINE = "0001"  # the Alembic revision of gradwatch 0.1's schema


def upgrade(engine) -> None:
    """Bring the database to the newest Alembic revision, in one transaction.

    A new database is created at the newest schema; a database from 0.1 (no Alembic version) is
    stamped at the 0.1 baseline first. On PostgreSQL an advisory lock makes server processes
    starting together (``--workers``, replicas) upgrade one after the other.
    """
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": UPGRADE_LOCK})
        config = _alembic_config(conn)
        current = MigrationContext.configure(conn).get_current_revision()
        if current is None and not inspect(conn).has_table("runs"):
            db.metadata.create_all(conn)
            command.stamp(config, "head")
            return
        new_summaries = not inspect(conn).has_table("summaries")  # before any step below creates it
        if current is None:
            command.stamp(config, BASELINE)
        if current != head_revision():
            log.warning(
                "gradwatch: upgrading the database schema from revision %s (%s) to %s, in place, once",
                current or BASELINE,
                "gradwatch 0.1" if current is None else "an older release",
                head_revision(),
            )
            command.upgrade(config, "head")
        ensure_schema(conn)  # repairs by hand-made changes too (a dropped column or index): cheap, idempotent
        if new_summaries:  # runs stored before the summaries table: from their chunks, once (not every start)
            summaries.backfill(conn)


def revision(conn) -> str | None:
    """The database's Alembic revision (None: new, or written by 0.1)."""
    return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    return ScriptDirectory.from_config(_alembic_config(None)).get_current_head()


def _alembic_config(conn) -> Config:
    config = Config()
    config.set_main_option("script_location", "gradwatch_server.storage:migrations")
    config.attributes["connection"] = conn
    return config


def to_chunks(conn) -> None:
    """Revision 0002: from 0.1's schema (or any later one) to chunked storage; safe to run twice."""
    insp = ensure_schema(conn)
    if insp.has_table("points") or insp.has_table("vectors"):
        log.warning("gradwatch: converting a database from gradwatch 0.1 to chunked storage (once)")
        convert_rows(conn, insp.has_table("points"), insp.has_table("vectors"))


def ensure_schema(conn):
    """Every table, column and index of this release present (and steps 64-bit); returns a fresh inspector."""
    db.metadata.create_all(conn)
    insp = inspect(conn)
    for table in db.metadata.sorted_tables:  # columns a later release added: from the schema itself
        have = {c["name"] for c in insp.get_columns(table.name)}
        for column in table.columns:
            if column.name not in have:
                ddl = CreateColumn(column).compile(dialect=conn.dialect)
                conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {ddl}"))
    for table, column in _narrow_steps(conn, insp):
        conn.execute(text(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE BIGINT"))
    _rebuild_changed_indexes(conn, insp)
    return inspect(conn)


def _narrow_steps(conn, insp) -> list[tuple[str, str]]:
    """64-bit columns an older release made 32-bit (PostgreSQL; SQLite integers are 64-bit anyway)."""
    if conn.dialect.name != "postgresql":
        return []
    have = set(insp.get_table_names())
    out = []
    for table in db.metadata.sorted_tables:
        if table.name in have:
            kinds = {c["name"]: str(c["type"]).upper() for c in insp.get_columns(table.name)}
            out += [
                (table.name, c.name)
                for c in table.columns
                if isinstance(c.type, db.BigInteger) and kinds.get(c.name) == "INTEGER"
            ]
    return out


def pending(conn) -> list[str]:
    """What ``upgrade`` would change, read without changing anything (``gradwatch db status``)."""
    insp = inspect(conn)
    have = set(insp.get_table_names())
    at, head = revision(conn), head_revision()
    out = [f"schema revision {at or 'none (gradwatch 0.1)'}, this release needs {head}"] if at != head and have else []
    out += [f"0.1 table {t} to convert" for t in ("points", "vectors") if t in have]
    for table in db.metadata.sorted_tables:
        if table.name not in have:
            out.append(f"table {table.name} missing")
            continue
        columns = {c["name"] for c in insp.get_columns(table.name)}
        out += [f"column {table.name}.{c.name} missing" for c in table.columns if c.name not in columns]
        indexes = {i["name"] for i in insp.get_indexes(table.name)}
        out += [f"index {i.name} missing" for i in table.indexes if i.name not in indexes]
    return out + [f"column {t}.{c} is 32-bit" for t, c in _narrow_steps(conn, insp)]


def _rebuild_changed_indexes(conn, insp) -> None:
    """A missing index is created; one whose columns changed between releases (same name) is rebuilt."""
    for table in db.metadata.sorted_tables:
        have = {ix["name"]: ix["column_names"] for ix in insp.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in have:
                index.create(conn)
            elif have[index.name] != [c.name for c in index.columns]:
                index.drop(conn)
                index.create(conn)


def convert_rows(conn, has_points: bool, has_vectors: bool) -> None:
    """Pack 0.1's row-per-point tables into chunks, rebuild every rollup, drop the old tables."""
    if has_points:
        for (key_id,) in conn.execute(text("SELECT DISTINCT key_id FROM points")).all():
            rows = conn.execute(
                text("SELECT step, wall_time, value FROM points WHERE key_id = :k ORDER BY step"), {"k": key_id}
            ).all()
            values = np.array([np.nan if r[2] is None else r[2] for r in rows], dtype=np.float64).reshape(-1, 1)
            _store(
                conn,
                key_id,
                np.array([r[0] for r in rows], dtype=np.int64),
                np.array([r[1] for r in rows], dtype=np.float64),
                values,
                None,
            )
    if has_vectors:
        for (key_id,) in conn.execute(text("SELECT DISTINCT key_id FROM vectors")).all():
            rows = conn.execute(
                text("SELECT step, wall_time, data, missing FROM vectors WHERE key_id = :k ORDER BY step"),
                {"k": key_id},
            ).all()
            width = max(len(r[2]) // 8 for r in rows)
            values = np.full((len(rows), width), np.nan)
            missing = np.zeros((len(rows), width), dtype=bool)
            for i, r in enumerate(rows):
                row = chunks.from_f64(r[2])
                values[i, : len(row)] = row
                missing[i, len(row) :] = True
                missing[i, [j for j in json.loads(r[3] or "[]") if j < width]] = True
            _store(
                conn,
                key_id,
                np.array([r[0] for r in rows], dtype=np.int64),
                np.array([r[1] for r in rows], dtype=np.float64),
                values,
                missing,
            )
    conn.execute(text("DELETE FROM rollups"))
    conn.execute(text("DELETE FROM rollup_heat"))
    layouts = {r.id: r.layers for r in conn.execute(db.metric_keys.select())}
    for key_id, layers in layouts.items():
        slots = len(json.loads(layers)) if layers else 1
        points = chunks.read(conn, key_id, slots=slots)
        if len(points) and slots:
            cache = rollup_cache.Cache()
            rollup_cache.new_key(cache, key_id)  # its rollups were deleted above: nothing to read back
            rollup_writes.update_rollups(
                conn, cache, key_id, points.steps, points.walls, points.values, points.present()
            )
    for table in ("points", "vectors"):
        conn.execute(text(f"DROP TABLE IF EXISTS {table}"))


def _store(conn, key_id, steps, walls, values, missing) -> None:
    if len(steps):
        chunks.append_now(conn, chunks.Tail(), key_id, chunks.Points(steps, walls, values, missing))
