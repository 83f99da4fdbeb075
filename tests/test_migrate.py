"""A database written by gradwatch 0.1 opens in place: its points packed into chunks, rollups rebuilt."""

from __future__ import annotations

import json
import math
import sqlite3
import struct
from pathlib import Path

import pytest

from gradwatch_server.storage import database, migrate, store

SCHEMA = (Path(__file__).parent / "data" / "schema_0_1.sql").read_text()
PG_SCHEMA = (Path(__file__).parent / "data" / "schema_0_1_postgres.sql").read_text()


def _old_database(path: Path) -> None:
    """A 0.1 database with one run: a scalar with NaN/inf and a repeated step, and a 2-slot vector."""
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    con.execute(
        "INSERT INTO runs (id, uid, project, name, status, created_at, updated_at, last_step, last_seq, "
        "config, meta, alert_config, tags, notes) VALUES (1, 'u', 'p', 'old', 'finished', 1, 2, 2999, 7, "
        "'{}', '{}', '{}', '[]', '')"
    )
    con.execute("INSERT INTO metric_keys (id, run_id, key, layers) VALUES (1, 1, 'loss', NULL)")
    con.execute("INSERT INTO metric_keys (id, run_id, key, layers) VALUES (2, 1, 'grad', ?)", (json.dumps(["a", "b"]),))
    rows = [(1, s, 100.0 + s, None if s == 7 else (math.inf if s == 8 else 1.0 / (s + 1))) for s in range(3000)]
    rows.append((1, 5, 99.0, 42.0))  # the same step logged twice
    con.executemany("INSERT INTO points VALUES (?, ?, ?, ?)", rows)
    con.executemany(
        "INSERT INTO vectors VALUES (?, ?, ?, ?, ?)",
        [(2, s, 100.0 + s, struct.pack("<2d", s, 2.0 * s), "[1]" if s == 3 else None) for s in range(3000)],
    )
    con.execute("INSERT INTO rollups VALUES (1, 16, 0, 16, ?)", (b"\0" * 7 * 8,))  # old 7-row format
    con.execute(
        "INSERT INTO alerts (run_id, kind, step, severity, message, created_at) "
        "VALUES (1, 'nan_loss', 7, 'critical', 'NaN', 1)"
    )
    con.commit()
    con.close()


def test_a_0_1_database_is_converted_in_place(tmp_path):
    path = tmp_path / "old.db"
    _old_database(path)
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        loss = store.get_series(conn, 1, "loss")
        assert len(loss["steps"]) == 3001 and loss["steps"][:7] == [0, 1, 2, 3, 4, 5, 5]
        assert loss["values"][8] == "NaN" and loss["values"][9] == "Infinity" and 42.0 in loss["values"][5:7]
        assert store.get_series(conn, 1, "grad/b", start=2, end=4)["values"] == [4.0, None, 8.0]
        env = store.get_series(conn, 1, "loss", max_points=40)  # from rebuilt rollups, walls included
        assert "NaN" in env["values"] and "Infinity" in env["values"] and None not in env["wall_times"]
        assert [a["count"] for a in store.get_alerts(conn, 1)] == [1]
        tables = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "points" not in tables and "vectors" not in tables
    with engine.connect() as conn:
        assert migrate.revision(conn) == migrate.head_revision() == "0011"  # Alembic's record of it
    engine.dispose()
    database.make_engine(f"sqlite:///{path}").dispose()  # opening again is a no-op


@pytest.mark.slow
def test_a_0_1_postgres_database_is_upgraded_in_place(postgres_url):
    from sqlalchemy import create_engine, text

    url = postgres_url.replace("postgresql://", "postgresql+psycopg2://")
    old = create_engine(url)
    with old.begin() as conn:
        for name in ("alerts", "rollups", "vectors", "points", "metric_keys", "runs", "chunks"):
            conn.execute(text(f"DROP TABLE IF EXISTS {name} CASCADE"))
        ddl = "\n".join(line for line in PG_SCHEMA.splitlines() if not line.startswith("--"))
        for statement in ddl.split(";"):
            if statement.strip():
                conn.execute(text(statement))
        conn.execute(
            text(
                "INSERT INTO runs (uid, project, name, status, created_at, updated_at, last_step, last_seq, "
                "config, meta, alert_config, tags, notes) VALUES ('pg-old', 'p', 'old', 'running', 1, 2, 9, "
                "3, '{}', '{}', '{}', '[]', '')"
            )
        )
        run_id = conn.execute(text("SELECT id FROM runs")).scalar()
        conn.execute(text("INSERT INTO metric_keys (run_id, key) VALUES (:r, 'loss')"), {"r": run_id})
        key_id = conn.execute(text("SELECT id FROM metric_keys")).scalar()
        conn.execute(
            text("INSERT INTO points VALUES (:k, :s, :s, :v)"),
            [{"k": key_id, "s": s, "v": None if s == 4 else float(s)} for s in range(10)],
        )
    old.dispose()
    engine = database.make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            loss = store.get_series(conn, run_id, "loss")
            assert loss["steps"] == list(range(10)) and loss["values"][4] == "NaN"
            kind = conn.execute(
                text(
                    "SELECT data_type FROM information_schema.columns WHERE table_name = 'runs' "
                    "AND column_name = 'last_step'"
                )
            ).scalar()
        assert kind == "bigint"  # steps counted in tokens pass 2**31
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET last_step = :s"), {"s": 2**40})
    finally:
        engine.dispose()


def test_an_index_whose_definition_changed_is_rebuilt(tmp_path):
    path = tmp_path / "ix.db"
    database.make_engine(f"sqlite:///{path}").dispose()
    con = sqlite3.connect(path)
    con.execute("DROP INDEX ix_chunks_key_last")
    con.execute("CREATE INDEX ix_chunks_key_last ON chunks (key_id, last_step)")  # an older definition
    con.commit()
    con.close()
    database.make_engine(f"sqlite:///{path}").dispose()
    con = sqlite3.connect(path)
    columns = [r[2] for r in con.execute("PRAGMA index_info(ix_chunks_key_last)")]
    con.close()
    assert columns == ["key_id", "last_step", "first_step"]


def test_a_new_database_starts_at_the_newest_revision(tmp_path):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'new.db'}")
    with engine.connect() as conn:
        assert migrate.revision(conn) == migrate.head_revision()
    engine.dispose()
