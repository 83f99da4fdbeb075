"""Database schema and engine (SQLAlchemy Core; SQLite by default, PostgreSQL compatible).

Storage notes:
- ``points`` holds one row per scalar per step; NaN is stored as NULL (SQLite cannot
  store NaN; every value we store is otherwise non-NULL) and +/-inf as real infinities.
- ``vectors`` holds one row per step for a vector key (per-layer gradient norms): the
  values packed as little-endian float64 (NaN and inf kept bit-exact) plus the indices of
  slots that had no value (``.grad is None``). A transformer's ~300 per-layer norms cost
  one row per step instead of 300.
- Both are indexed by (key_id, step): "one key of one run, ordered by step" is a range read.
- ``rollups`` summarises every block of 16, 64, ... 65536 steps per key (see rollup.py), so a
  chart of a million-step run reads a few thousand rows and still shows every spike and NaN.
"""

from __future__ import annotations

import array
import json
import math
import sys
from pathlib import Path

from sqlalchemy import (Column, Float, ForeignKey, Index, Integer, LargeBinary, MetaData, String, Table, Text,
                        UniqueConstraint, create_engine, event)
from sqlalchemy.engine import Engine

metadata = MetaData()

runs = Table(
    "runs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("uid", String(64), nullable=False, unique=True),
    Column("project", String(200), nullable=False, index=True),
    Column("name", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("finished_at", Float),
    Column("last_step", Integer),
    Column("last_seq", Integer, nullable=False, default=0),
    Column("config", Text, nullable=False, default="{}"),
    Column("meta", Text, nullable=False, default="{}"),
    Column("alert_config", Text, nullable=False, default="{}"),
    Column("tags", Text, nullable=False, default="[]"),
    Column("notes", Text, nullable=False, default=""),
    Column("error", Text),
)

metric_keys = Table(
    "metric_keys", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(256), nullable=False),
    Column("layers", Text),  # JSON list of slot names for vector keys, NULL for scalars
    UniqueConstraint("run_id", "key", name="uq_metric_keys_run_key"),
)

points = Table(
    "points", metadata,
    Column("key_id", Integer, nullable=False),
    Column("step", Integer, nullable=False),
    Column("wall_time", Float, nullable=False),
    Column("value", Float),  # NULL means NaN
    Index("ix_points_key_step", "key_id", "step"),
)

vectors = Table(
    "vectors", metadata,
    Column("key_id", Integer, nullable=False),
    Column("step", Integer, nullable=False),
    Column("wall_time", Float, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("missing", Text),  # JSON list of slot indices without a value, NULL when none
    Index("ix_vectors_key_step", "key_id", "step"),
)

rollups = Table(  # per-block summaries for fast, spike-preserving reads of big runs (see rollup.py)
    "rollups", metadata,
    Column("key_id", Integer, nullable=False),
    Column("level", Integer, nullable=False),
    Column("block", Integer, nullable=False),
    Column("n", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    UniqueConstraint("key_id", "level", "block", name="uq_rollups_key_level_block"),
)

alerts = Table(
    "alerts", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("kind", String(40), nullable=False),
    Column("step", Integer),
    Column("key", String(256)),
    Column("layer", String(256)),
    Column("value", Float),
    Column("severity", String(16), nullable=False),
    Column("message", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)


def make_engine(url: str) -> Engine:
    """Create the engine and the tables; SQLite gets WAL mode and a busy timeout."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")  # durable across app crashes in WAL mode
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    else:
        engine = create_engine(_postgres_driver(url), pool_pre_ping=True)
    metadata.create_all(engine)
    return engine


def _postgres_driver(url: str) -> str:
    """Plain postgresql:// uses whichever driver is installed (psycopg 3, else psycopg2)."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    import importlib.util

    rest = url.split("://", 1)[1]
    driver = "psycopg" if importlib.util.find_spec("psycopg") else "psycopg2"
    return f"postgresql+{driver}://{rest}"


def pack_vector(values: list) -> tuple[bytes, str | None]:
    """Pack a vector for storage: float64 bytes and the JSON list of missing slots."""
    missing = [i for i, v in enumerate(values) if v is None]
    data = array.array("d", [math.nan if v is None else v for v in values])
    if sys.byteorder != "little":
        data.byteswap()
    return data.tobytes(), (json.dumps(missing) if missing else None)


def unpack_vector(data: bytes, missing: str | None) -> list:
    """Inverse of ``pack_vector``: floats with None in the missing slots."""
    values = array.array("d")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    out: list = values.tolist()
    for i in json.loads(missing) if missing else ():
        out[i] = None
    return out


def to_db_float(value: float) -> float | None:
    """NaN becomes NULL; everything else is stored as is."""
    return None if math.isnan(value) else value


def from_db_float(value: float | None) -> float:
    return math.nan if value is None else value
