"""Database schema (SQLAlchemy Core; SQLite by default, PostgreSQL compatible); the engine is database.py's.

Storage notes (the measurements behind them are in docs/storage.md):
- ``chunks`` holds a key's points in blocks: one row per key per up to ``CHUNK_POINTS`` steps,
  with the steps (int64), wall times and values (float64, NaN and inf bit-exact) packed
  little-endian. A vector key (per-layer gradient norms) keeps ``slots`` values per step and a
  uint8 mask of the slots that had no value (``.grad is None``). Storing a block costs one row
  where one row per point cost hundreds, so ingest runs faster than raw row-per-point inserts.
- Chunks of one key may overlap in steps (out-of-order or repeated steps); readers merge them.
- ``rollups`` summarises every block of 16, 64, ... 65536 steps per key (see rollup.py), so a
  chart of a million-step run reads a few thousand rows and still shows every spike and NaN.
- Steps are 64-bit on every engine (steps counted in tokens or samples pass 2**31 easily).
"""

from __future__ import annotations

import math

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from gradwatch.contract import MAX_KEY_LEN, MAX_NAME_LEN

metadata = MetaData()

sessions = Table(  # browser logins (web/sessions.py): the cookie's SHA-256, never the cookie itself
    "sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False, index=True),
    Column("token_digest", String(64)),  # the token that logged in (web/tokens.py): revoking it ends the session
)

tokens = Table(  # named API tokens with a role (web/tokens.py): the secret's SHA-256, never the secret
    "tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("digest", String(64), nullable=False, unique=True),
    Column("role", String(16), nullable=False),
    Column("projects", Text),  # JSON list of project names; NULL: every project
    Column("created_at", Float, nullable=False),
    Column("created_by", String(200)),
    Column("expires_at", Float),
    Column("revoked_at", Float),
    Column("last_used_at", Float),
)

audit = Table(  # who did what, when (web/audit.py): every write through the API, logins, token changes
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False, index=True),
    Column("who", String(200), nullable=False),
    Column("role", String(16), nullable=False),
    Column("action", String(300), nullable=False),
    Column("status", Integer),
    Column("project", String(MAX_NAME_LEN)),
    Column("detail", Text),
)

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("uid", String(64), nullable=False, unique=True),
    Column("secret", String(64)),  # sha256 of the client's per-run secret: only that client may resume the run
    Column("project", String(MAX_NAME_LEN), nullable=False, index=True),
    Column("name", String(MAX_NAME_LEN), nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),  # the last data (or status change)
    Column("seen_at", Float),  # the last sign of life of its client (server heartbeat)
    Column("finished_at", Float),
    Column("last_step", BigInteger),
    Column("last_seq", Integer, nullable=False, default=0),
    Column("config", Text, nullable=False, default="{}"),
    Column("meta", Text, nullable=False, default="{}"),
    Column("alert_config", Text, nullable=False, default="{}"),
    Column("tags", Text, nullable=False, default="[]"),
    Column("notes", Text, nullable=False, default=""),
    Column("error", Text),
    Column("created_by", String(200)),  # the name of the token whose ingest connection created the run
)

metric_keys = Table(
    "metric_keys",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(MAX_KEY_LEN), nullable=False),
    Column("layers", Text),  # JSON list of slot names for vector keys, NULL for scalars
    UniqueConstraint("run_id", "key", name="uq_metric_keys_run_key"),
)

chunks = Table(  # a key's points in blocks; see the module docstring and chunks.py
    "chunks",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key_id", Integer, nullable=False),
    Column("first_step", BigInteger, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    Column("n", Integer, nullable=False),
    # 1: a small row not yet merged into a full chunk (since 0009, whose wide vectors' full chunks hold 64
    # steps); NULL: a full chunk, or a row from before 0009, told by ``n`` (chunks.small_rows).
    Column("small", Integer),
    # A compressed row (blocks/codec.py, since 0.3) holds everything in ``data``; steps and walls are empty.
    Column("steps", LargeBinary, nullable=False),  # n int64 (raw rows)
    Column("walls", LargeBinary, nullable=False),  # n float64 (unix seconds; raw rows)
    Column("data", LargeBinary, nullable=False),  # n x slots float64 (raw), or the compressed block
    Column("missing", LargeBinary),  # n x slots uint8, 1 = no value; NULL when none (or compressed)
    Index("ix_chunks_key_last", "key_id", "last_step", "first_step"),  # covering: a range lookup reads no rows
)

run_clock = Table(  # a run's step -> wall time, once for all its keys (storage/blocks/clock.py)
    "run_clock",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, nullable=False),
    Column("first_step", BigInteger, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    Column("n", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),  # codec.encode_chunk of its steps and walls, no values
    Index("ix_run_clock_run_last", "run_id", "last_step", "first_step"),
)

rollups = Table(  # per-block summaries for fast, spike-preserving reads of big runs (see rollup.py)
    "rollups",
    metadata,
    Column("key_id", Integer, nullable=False),
    Column("level", Integer, nullable=False),
    Column("block", BigInteger, nullable=False),
    Column("n", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),  # (12, slots) float64 (0.2), or encoded (blocks/arrays.py)
    UniqueConstraint("key_id", "level", "block", name="uq_rollups_key_level_block"),
)

rollup_heat = Table(  # per rollup block of a vector key: what a heatmap needs, packed small (rollup.heat_of)
    "rollup_heat",
    metadata,
    Column("key_id", Integer, nullable=False),
    Column("level", Integer, nullable=False),
    Column("block", BigInteger, nullable=False),
    Column("data", LargeBinary, nullable=False),  # encoded (2, slots): finite maxima, flags (0.2: f64 then u8)
    UniqueConstraint("key_id", "level", "block", name="uq_rollup_heat_key_level_block"),
)

summaries = Table(  # per run and scalar key: last, min, max (with their steps), count; kept at ingest (summaries.py)
    "summaries",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(MAX_KEY_LEN), nullable=False),
    Column("count", Integer, nullable=False),
    Column("nans", Integer, nullable=False, default=0, server_default="0"),  # NaN values (SQL has no NaN)
    Column("last", Float),  # NULL: the last value was NaN
    Column("last_step", BigInteger),
    Column("min", Float),  # NULL: no value but NaN so far
    Column("min_step", BigInteger),
    Column("max", Float),
    Column("max_step", BigInteger),
    Column("total", Float),  # the sum of the values but NaN (the mean); NULL: rows from before 0008, or inf - inf
    UniqueConstraint("run_id", "key", name="uq_summaries_run_key"),
)

media = Table(  # histograms, images, tables and text a run logged (ingest/media.py writes, storage/media.py reads)
    "media",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(MAX_KEY_LEN), nullable=False),
    Column("kind", String(16), nullable=False),  # gradwatch.protocol.MEDIA_KINDS
    Column("step", BigInteger, nullable=False),
    Column("idx", Integer, nullable=False, default=0),  # an image's place in a list logged under one key
    Column("wall", Float, nullable=False),
    Column("meta", Text, nullable=False),  # JSON: histogram range and non-finite counts; image size, caption
    Column("body", LargeBinary, nullable=False),  # counts (int64 LE), PNG bytes, or UTF-8 JSON (table, text)
    Column("nbytes", Integer, nullable=False),
    UniqueConstraint("run_id", "key", "step", "idx", name="uq_media_run_key_step_idx"),
    Index("ix_media_run_kind_key_step", "run_id", "kind", "key", "step"),
)

run_summary = Table(  # what a script set in run.summary (W&B's), shown beside the automatic summaries
    "run_summary",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(MAX_KEY_LEN), nullable=False),
    Column("value", Text, nullable=False),  # JSON, non-finite numbers as the float codec's strings
    UniqueConstraint("run_id", "key", name="uq_run_summary_run_key"),
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("kind", String(40), nullable=False),
    Column("step", BigInteger),  # the first bad step (onset)
    Column("last_step", BigInteger),  # the latest step it recurred at
    Column("confirmed_step", BigInteger),  # where the rule became sure (after its patience)
    Column("count", Integer, nullable=False, default=1, server_default="1"),  # times it fired (recurrences merge)
    Column("key", String(MAX_KEY_LEN)),
    Column("layer", String(MAX_KEY_LEN)),
    Column("value", Float),
    Column("severity", String(16), nullable=False),
    Column("message", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float),
    Column("incident_id", Integer, index=True),  # the incident it belongs to (health/incidents.py)
)

project_rules = Table(  # a project's alert rules as edited in the page (server/rules/policy.py)
    "project_rules",
    metadata,
    Column("project", String(MAX_NAME_LEN), primary_key=True),
    Column("rules", Text, nullable=False),  # the validated rules document, JSON
    Column("updated_at", Float, nullable=False),
    Column("updated_by", String(200)),
)

rules_log = Table(  # who changed a project's rules, what and when
    "rules_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(MAX_NAME_LEN), nullable=False, index=True),
    Column("at", Float, nullable=False),
    Column("by", String(200)),
    Column("changes", Text, nullable=False),  # JSON list of "what: before -> after"
)

notify_channels = Table(  # a project's notification channels (server/notify/channels.py)
    "notify_channels",
    metadata,
    Column("project", String(MAX_NAME_LEN), primary_key=True),
    Column("channels", Text, nullable=False),  # JSON list of validated channels
    Column("updated_at", Float, nullable=False),
)

deliveries = Table(  # every notification sent or given up on, with why
    "deliveries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project", String(MAX_NAME_LEN), nullable=False, index=True),
    Column("run_id", Integer),
    Column("incident_id", Integer),
    Column("channel", String(400), nullable=False),  # e.g. "slack https://hooks..." or "email a@b"
    Column("status", String(16), nullable=False),  # delivered / failed / limited
    Column("reason", Text),
    Column("attempts", Integer, nullable=False),
    Column("at", Float, nullable=False),
)

incidents = Table(  # alerts of a run that share a cause: a root and its consequences (health/incidents.py)
    "incidents",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("root_alert_id", Integer),
    Column("kind", String(40), nullable=False),  # the root alert's kind
    Column("family", String(40), nullable=False),  # which kinds may join it
    Column("cause", Text),  # the cause when one is visible (the LR at onset against where the loss fell, a layer)
    Column("first_step", BigInteger),
    Column("last_step", BigInteger),
    Column("severity", String(16), nullable=False),
    Column("status", String(16), nullable=False, default="open"),  # open / acknowledged / snoozed / resolved
    Column("snoozed_until", Float),
    Column("status_by", String(200)),  # who changed the status
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)


def to_db_float(value: float) -> float | None:
    """NaN becomes NULL (SQL has no NaN); everything else is stored as is."""
    return None if math.isnan(value) else value


def from_db_float(value: float | None) -> float:
    return math.nan if value is None else value
