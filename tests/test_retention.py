"""Retention: gradwatch gc, the hourly schedule, deleting a big run in slices, db upgrade/status."""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
from conftest import in_thread, run_async
from sqlalchemy import func, select, text, update

from gradwatch import protocol
from gradwatch_server import cli
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.services import Services
from gradwatch_server.settings import Settings, from_env
from gradwatch_server.storage import database, db, migrate, retention

DAY = 86400.0
LAYERS = 8


def seed(
    engine,
    name: str,
    steps: int = 300,
    status: str = "finished",
    age_days: float = 100.0,
    tags: list | None = None,
    vector_steps: int = 0,
) -> int:
    """A run ingested through the real path (loss with a NaN: one alert), then aged and given a status."""
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": f"uid-{name}", "project": "p", "name": name}, {})["run_id"]
        state = load_state(conn, run_id)
    for seq, lo in enumerate(range(0, steps, 5000), start=1):
        hi = min(lo + 5000, steps)
        records = [
            (
                i,
                float(i),
                {"loss": math.nan if i == 7 else 1.0 / (1 + i)},
                {"grad": [0.1] * LAYERS} if i < vector_steps else {},
            )
            for i in range(lo, hi)
        ]
        msg = {
            "type": "batch",
            "seq": seq,
            "columns": protocol.encode_columns(records),
            "layouts": {"grad": [f"l{j}" for j in range(LAYERS)]},
        }
        with engine.begin() as conn:
            apply_batch(conn, state, decode(msg))
    with engine.begin() as conn:
        conn.execute(
            update(db.runs)
            .where(db.runs.c.id == run_id)
            .values(status=status, updated_at=time.time() - age_days * DAY, tags=json.dumps(tags or []))
        )
    return run_id


def owned(engine, run_id: int) -> dict:
    """Rows a run owns, per table."""
    keys = select(db.metric_keys.c.id).where(db.metric_keys.c.run_id == run_id).scalar_subquery()
    with engine.connect() as conn:
        count = lambda t, cond: conn.execute(select(func.count()).select_from(t).where(cond)).scalar()  # noqa: E731
        return {
            "runs": count(db.runs, db.runs.c.id == run_id),
            "keys": count(db.metric_keys, db.metric_keys.c.run_id == run_id),
            "chunks": count(db.chunks, db.chunks.c.key_id.in_(keys)),
            "rollups": count(db.rollups, db.rollups.c.key_id.in_(keys)),
            "alerts": count(db.alerts, db.alerts.c.run_id == run_id),
        }


@pytest.fixture
def offline(tmp_path):
    services = retention.Offline(f"sqlite:///{tmp_path / 'gc.db'}")
    yield services
    services.close()


@pytest.mark.parametrize(
    "text_, seconds",
    [
        ("90d", 90 * DAY),
        ("12h", 43200),
        ("30m", 1800),
        ("45s", 45),
        ("2w", 14 * DAY),
        ("1.5d", 1.5 * DAY),
        (" 7D ", 7 * DAY),
    ],
)
def test_durations(text_, seconds):
    assert retention.parse_duration(text_) == seconds


@pytest.mark.parametrize("bad", ["90", "d", "-3d", "0d", "3y", "", "3 days"])
def test_bad_durations_name_the_forms(bad):
    with pytest.raises(ValueError, match="90d, 12h, 30m"):
        retention.parse_duration(bad)


def test_collect_deletes_only_old_inactive_runs(offline):
    e = offline.engine
    ids = {
        name: seed(e, name, **kw)
        for name, kw in {
            "old-finished": {},
            "old-crashed": {"status": "crashed"},
            "old-failed": {"status": "failed"},
            "old-running": {"status": "running"},
            "old-stalled": {"status": "stalled"},
            "new-finished": {"age_days": 10},
            "old-tagged": {"tags": ["keep"]},
        }.items()
    }
    before = {name: owned(e, i) for name, i in ids.items()}
    assert all(b["chunks"] and b["rollups"] and b["alerts"] == 1 for b in before.values())

    listed = run_async(retention.collect(offline, 90 * DAY, keep_tagged=True, dry_run=True))
    assert [r["name"] for r in listed] == ["old-finished", "old-crashed", "old-failed"]
    assert listed[0]["points"] == 300 and {name: owned(e, i) for name, i in ids.items()} == before  # nothing deleted

    deleted = run_async(retention.collect(offline, 90 * DAY, keep_tagged=True))
    assert sorted(r["name"] for r in deleted) == ["old-crashed", "old-failed", "old-finished"]
    for name, run_id in ids.items():
        gone = name in ("old-finished", "old-crashed", "old-failed")
        assert owned(e, run_id) == ({k: 0 for k in before[name]} if gone else before[name]), name

    deleted = run_async(retention.collect(offline, 90 * DAY, keep_tagged=False))
    assert [r["name"] for r in deleted] == ["old-tagged"] and owned(e, ids["old-tagged"])["runs"] == 0


def test_a_big_run_is_deleted_in_slices_with_other_jobs_in_between(offline, monkeypatch):
    e = offline.engine
    big = seed(e, "big", steps=12000, vector_steps=3000)
    other = seed(e, "other", steps=50)
    other_before = owned(e, other)
    order: list[str] = []
    for name in ("_begin", "_chunk_slice", "_rollup_slice", "_finish"):
        real = getattr(retention, name)

        def wrapped(*args, _real=real, _name=name):
            order.append(_name)
            if len(order) in (2, 5):  # while a slice runs, a batch arrives: it is queued behind this slice only
                offline.writer.submit(lambda conn: order.append("ingest"))
            return _real(*args)

        monkeypatch.setattr(retention, name, wrapped)

    assert run_async(retention.delete_run_in_slices(offline, big, chunk_rows=4, rollup_values=512)) is True
    assert order[0] == "_begin" and order[-1] == "_finish"
    assert order.count("_chunk_slice") > 3 and order.count("_rollup_slice") > 3
    # Each queued batch ran right after the slice it arrived during, not after the whole delete.
    assert [i for i, name in enumerate(order) if name == "ingest"] == [2, 5]
    assert order[1] == order[3] == order[4] == order[6] == "_chunk_slice"
    assert owned(e, big) == {"runs": 0, "keys": 0, "chunks": 0, "rollups": 0, "alerts": 0}
    assert owned(e, other) == other_before


def test_a_run_that_resumed_since_the_listing_is_kept(offline):
    e = offline.engine
    run_id = seed(e, "resumed")
    policy = retention.Policy(cutoff=time.time() - 90 * DAY)
    with e.begin() as conn:  # the training job reconnected after the listing
        conn.execute(update(db.runs).where(db.runs.c.id == run_id).values(status="running", updated_at=time.time()))
    assert run_async(retention.delete_run_in_slices(offline, run_id, policy)) is False
    assert owned(e, run_id)["chunks"] > 0


def test_gc_command_lists_then_deletes(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    engine = database.make_engine(url)
    old, tagged = seed(engine, "old"), seed(engine, "tagged", tags=["paper"])
    fresh = seed(engine, "fresh", age_days=1)
    engine.dispose()

    def gc(*flags):
        with pytest.raises(SystemExit) as exit_:
            in_thread(cli.main, ["gc", "--db", url, *flags])
        return exit_.value.code, capsys.readouterr()

    code, out = gc("--older-than", "90d", "--keep-tagged", "--dry-run")
    assert code == 0 and f"would delete run {old} p/old (finished" in out.out and "300 points" in out.out
    assert "tagged" not in out.out and "nothing deleted (--dry-run)" in out.out
    code, out = gc("--older-than", "90d", "--json")
    result = json.loads(out.out)
    assert code == 0 and sorted(r["id"] for r in result["runs"]) == [old, tagged] and result["points"] == 600
    assert result["dry_run"] is False and result["count"] == 2
    code, out = gc("--older-than", "90d")
    assert code == 0 and "no run to delete" in out.out
    engine = database.make_engine(url)
    assert [owned(engine, i)["runs"] for i in (old, tagged, fresh)] == [0, 0, 1]
    engine.dispose()
    code, out = gc("--older-than", "ninety")
    assert code != 0 and "--older-than 'ninety' is not a duration" in str(code)


def test_the_server_collects_on_schedule(tmp_path):
    url = f"sqlite:///{tmp_path / 'sched.db'}"
    engine = database.make_engine(url)
    old, fresh = seed(engine, "old"), seed(engine, "fresh", age_days=5)
    engine.dispose()

    async def scenario():
        services = Services(Settings(db=url, retention_days=30, retention_keep_tagged=True))
        published = []
        services.hub.publish = lambda channel, message: published.append((channel, message))
        task = asyncio.create_task(retention.run_on_schedule(services, every=0.05))
        try:
            for _ in range(400):
                if not services.read(
                    lambda conn: conn.execute(select(db.runs.c.id).where(db.runs.c.id == old)).first()
                ):
                    break
                await asyncio.sleep(0.05)
            return services.read(lambda conn: sorted(conn.execute(select(db.runs.c.id)).scalars())), published
        finally:
            task.cancel()
            services.close()

    left, published = run_async(scenario())
    assert left == [fresh]
    assert ("runs", {"type": "deleted", "id": old}) in published  # open runs lists drop it live


def test_schedule_is_off_by_default(tmp_path):
    services = Services(Settings(db=f"sqlite:///{tmp_path / 'off.db'}"))
    try:
        assert run_async(asyncio.wait_for(retention.run_on_schedule(services, every=0.01), 5)) is None
    finally:
        services.close()


def test_retention_settings_from_env():
    s = from_env({"GRADWATCH_RETENTION_DAYS": "90", "GRADWATCH_RETENTION_KEEP_TAGGED": "false"})
    assert (s.retention_days, s.retention_keep_tagged) == (90.0, False)
    assert from_env({}).retention_days == 0 and from_env({}).retention_keep_tagged is True
    with pytest.raises(ValueError, match="GRADWATCH_RETENTION_KEEP_TAGGED"):
        from_env({"GRADWATCH_RETENTION_KEEP_TAGGED": "maybe"})
    with pytest.raises(ValueError, match="retention_days must be >= 0"):
        from_env({"GRADWATCH_RETENTION_DAYS": "-1"})


def test_db_status_and_upgrade(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'schema.db'}"

    def run(*argv):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["db", *argv, "--db", url])
        return exit_.value.code, capsys.readouterr().out

    assert run("status") == (0, f"gradwatch: {url} does not exist yet; `gradwatch serve` creates it\n")
    code, out = run("upgrade")
    assert code == 0 and "upgraded (a new database)" in out
    assert run("status") == (0, f"gradwatch: {url} is current\n")
    engine = database.make_engine(url)
    with engine.begin() as conn:  # as an older release left it: no per-run secret
        conn.execute(text("ALTER TABLE runs DROP COLUMN secret"))
    engine.dispose()
    code, out = run("status")
    assert code == 3 and "needs `gradwatch db upgrade`" in out and "column runs.secret missing" in out
    code, out = run("upgrade")
    assert code == 0 and "upgraded (column runs.secret missing)" in out
    assert run("status")[0] == 0 and run("upgrade") == (0, f"gradwatch: {url} was already current; nothing to do\n")


def test_db_status_names_a_missing_index(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'index.db'}"
    engine = database.make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_chunks_key_last"))
    engine.dispose()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["db", "status", "--db", url])
    assert exit_.value.code == 3 and "index ix_chunks_key_last missing" in capsys.readouterr().out


def test_db_wait_gives_up_with_a_clear_message():
    with pytest.raises(SystemExit) as exit_:
        cli.main(["db", "wait", "--timeout", "1", "--db", "postgresql://gw:secret-pw@127.0.0.1:9/none"])
    message = str(exit_.value.code)
    assert "did not answer within 1 s" in message and "check GRADWATCH_DB" in message
    assert "secret-pw" not in message and "***" in message


@pytest.mark.slow
def test_on_postgres_one_process_collects_at_a_time(postgres_url):
    services = retention.Offline(postgres_url)
    try:
        old = seed(services.engine, "pg-old", steps=3000, vector_steps=500)
        assert retention.LOCK_KEY != migrate.UPGRADE_LOCK  # a starting process must not wait for a gc pass
        holder = retention.try_lock(services.engine)  # another server process is collecting
        assert holder not in (None, False)
        assert run_async(retention.one_pass(services, 90 * DAY, True)) == []
        assert owned(services.engine, old)["chunks"] > 0
        retention.unlock(holder)
        deleted = run_async(retention.one_pass(services, 90 * DAY, True))
        assert [r["id"] for r in deleted] == [old]
        assert owned(services.engine, old) == {"runs": 0, "keys": 0, "chunks": 0, "rollups": 0, "alerts": 0}
    finally:
        services.close()
