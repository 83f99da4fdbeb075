"""Opening a database: the engine (SQLite pragmas, the PostgreSQL driver) and its schema brought current.

The engine factory lives here, not in db.py, so that the schema module imports nothing of the
migrations: db.py (tables) <- chunks/rollup <- migrate <- database.py, with no cycle.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url

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


def wal_sync(url: str) -> WalSync | None:
    """The group fsync of a SQLite file's WAL (``Writer(sync=...)``); None for PostgreSQL or an in-memory database."""
    if not url.startswith("sqlite"):
        return None
    path = make_url(url).database
    return WalSync(path) if path and path != ":memory:" and not path.startswith("file:") else None


class WalSync:
    """fsync of a SQLite database's ``-wal`` file, as ``synchronous=FULL`` does at each commit, on call.

    Under WAL with ``synchronous=NORMAL`` a commit's frames are written to the -wal file (the OS
    holds them) and a checkpoint syncs the WAL before and the database after it; so one fsync of the
    -wal file makes every commit before it survive a power loss. A new -wal file (another inode)
    gets its directory synced once, as SQLite does for a journal it creates.
    """

    def __init__(self, db_path: str):
        self.path = os.path.abspath(db_path) + "-wal"
        self._fd: int | None = None
        self._ino: int | None = None

    def __call__(self) -> None:
        try:
            ino = os.stat(self.path).st_ino
        except FileNotFoundError:  # no WAL: every commit is in the database file, synced by its checkpoint
            return
        if ino != self._ino:
            self._open()
        os.fsync(self._fd)

    def _open(self) -> None:
        self.close()
        self._fd = os.open(self.path, os.O_RDONLY)
        self._ino = os.fstat(self._fd).st_ino
        directory = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._ino = None


def driver_url(url: str) -> str:
    """Plain postgresql:// uses whichever driver is installed (psycopg 3, else psycopg2)."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    rest = url.split("://", 1)[1]
    driver = "psycopg" if importlib.util.find_spec("psycopg") else "psycopg2"
    return f"postgresql+{driver}://{rest}"
