"""Opening a database: the engine (SQLite pragmas, the PostgreSQL driver) and its schema brought current.

The engine factory lives here, not in db.py, so that the schema module imports nothing of the
migrations: db.py (tables) <- chunks/rollup <- migrate <- database.py, with no cycle.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine

from gradwatch_server.storage import migrate

SYNCHRONOUS = ("full", "normal")


def make_engine(url: str, synchronous: str = "full") -> Engine:
    """Create the engine and bring the schema current (``migrate.upgrade``), as every start does.

    Args:
        url: a SQLAlchemy URL (``sqlite:///...`` or ``postgresql://...``).
        synchronous: SQLite only. "full": every commit reaches the disk before the batch is acked,
            so an ack survives a power loss or kernel crash; "normal" survives a crash of the server
            process only (the cost is measured in docs/storage.md).

    Returns:
        The engine, its database at the newest schema.
    """
    engine = connect(url, synchronous)
    migrate.upgrade(engine)
    return engine


def connect(url: str, synchronous: str = "full") -> Engine:
    """The engine alone (SQLite gets WAL mode and a busy timeout); the schema is left as it is."""
    if synchronous not in SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}")
    if not url.startswith("sqlite"):
        driver = driver_url(url)
        # psycopg2 runs an UPDATE executemany as one round trip per row; batch them (the rollup
        # recounts of a batch are hundreds of rows). INSERTs are multi-row VALUES either way.
        extra = {"executemany_mode": "values_plus_batch"} if driver.startswith("postgresql+psycopg2") else {}
        return create_engine(driver, pool_pre_ping=True, **extra)
    path = url.split("///", 1)[1] if "///" in url else ""
    if path and path != ":memory:":
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record):
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    return engine


def driver_url(url: str) -> str:
    """Plain postgresql:// uses whichever driver is installed (psycopg 3, else psycopg2)."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    rest = url.split("://", 1)[1]
    driver = "psycopg" if importlib.util.find_spec("psycopg") else "psycopg2"
    return f"postgresql+{driver}://{rest}"
