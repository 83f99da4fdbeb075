"""The ingest pipeline without HTTP: the seq claim (stored, duplicate, gap, deleted), the run cache and its
invalidation, and the pushes it publishes (encoded once, with the run's last step)."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import threading

import numpy as np
from conftest import run_async
from sqlalchemy import select

from gradwatch import protocol
from gradwatch_server.ingest.batch import Batch, Column, decode
from gradwatch_server.live.fanout import MAX_PAYLOAD, PgFanout
from gradwatch_server.live.hub import points_message
from gradwatch_server.services import Services
from gradwatch_server.settings import Settings
from gradwatch_server.storage import db, edits, retention, store


def _batch(seq: int, steps, loss: float = 0.5):
    records = [(s, 1000.0 + s, {"loss": loss}, {}) for s in steps]
    return decode({"type": "batch", "seq": seq, "columns": protocol.encode_columns(records)})


def _services(tmp_path) -> Services:
    return Services(Settings(db=f"sqlite:///{tmp_path / 'pipeline.db'}"))


async def _open(services: Services, uid: str = "u") -> int:
    return (await services.pipeline.open_run({"uid": uid, "project": "p", "name": "n"}))["run_id"]


async def _live_runs(services: Services, n: int, links: list) -> list:
    """``n`` open runs, with ``links[0]`` live links as the pipeline counts them (change it to change that)."""
    services.pipeline.links = lambda: links[0]
    return [await _open(services, f"u{i}") for i in range(n)]


def _loss_steps(services: Services, run_id: int) -> list:
    return services.read(store.get_series, run_id, "loss")["steps"]


def test_a_batch_is_claimed_once_duplicates_and_gaps_are_answered(tmp_path):
    async def scenario():
        services = _services(tmp_path)
        try:
            pipeline = services.pipeline
            run_id = await _open(services)
            first = await pipeline.submit(run_id, _batch(1, range(3)))
            assert first["last_step"] == 2 and first["refused"] is None and pipeline.cached(run_id)
            assert await pipeline.submit(run_id, _batch(1, range(3))) == {"duplicate": True}
            assert await pipeline.submit(run_id, _batch(3, [9])) == {"expected": 2}
            assert (await pipeline.submit(run_id, _batch(2, [3, 4])))["last_step"] == 4
            assert _loss_steps(services, run_id) == [0, 1, 2, 3, 4]
        finally:
            services.close()

    run_async(scenario())


def test_with_many_live_runs_their_batches_share_one_commit_and_a_lone_runs_is_not_held(tmp_path):
    async def scenario():
        services, links = _services(tmp_path), [20]
        try:
            pipeline, writer = services.pipeline, services.writer
            runs = await _live_runs(services, 3, links)
            commits = writer.commits
            results = await asyncio.gather(*(pipeline.submit(r, _batch(1, [0, 1])) for r in runs))
            assert [r["last_step"] for r in results] == [1, 1, 1]
            assert writer.commits - commits == 1  # held for a tick, then stored back to back
            links[0] = 1
            assert pipeline.hold() == 0.0  # a lone run's points reach its page at once
            assert (await pipeline.submit(runs[0], _batch(2, [2])))["last_step"] == 2
            assert [_loss_steps(services, r) for r in runs] == [[0, 1, 2], [0, 1], [0, 1]]
        finally:
            services.close()

    run_async(scenario())


def test_the_claim_marks_the_run_row_its_newest_step_kept_and_a_batch_without_steps_leaves_it(tmp_path):
    def row(services, run_id):
        with services.engine.connect() as conn:
            return conn.execute(select(db.runs.c.last_step, db.runs.c.updated_at).where(db.runs.c.id == run_id)).one()

    async def scenario():
        services = _services(tmp_path)
        try:
            pipeline = services.pipeline
            run_id = await _open(services)
            await pipeline.submit(run_id, _batch(1, [5, 7]))
            step, first = row(services, run_id)
            assert step == 7
            await pipeline.submit(run_id, _batch(2, [2, 3]))  # older steps (a resumed run): the newest stays
            step, second = row(services, run_id)
            assert step == 7 and second >= first
            pipeline.invalidate(run_id)  # a reloaded cache agrees with the row
            await pipeline.submit(run_id, decode({"type": "batch", "seq": 3, "records": []}))
            assert row(services, run_id)[0] == 7
            assert (await pipeline.submit(run_id, _batch(4, [9])))["last_step"] == 9 and row(services, run_id)[0] == 9
        finally:
            services.close()

    run_async(scenario())


def test_an_edit_invalidates_the_run_and_the_next_batch_reloads_it(tmp_path):
    async def scenario():
        services = _services(tmp_path)
        try:
            pipeline = services.pipeline
            run_id = await _open(services)
            await pipeline.submit(run_id, _batch(1, range(3)))
            await services.write(edits.update_run, run_id, {"name": "renamed"})
            assert not pipeline.cached(run_id)
            assert (await pipeline.submit(run_id, _batch(2, [3])))["last_step"] == 3  # reloaded, seq 1 known
            assert pipeline.cached(run_id) and _loss_steps(services, run_id) == [0, 1, 2, 3]
            await asyncio.wrap_future(services.writer.submit(lambda _conn: pipeline.invalidate_all()))
            assert not pipeline.cached(run_id)
        finally:
            services.close()

    run_async(scenario())


def test_a_cache_behind_another_process_is_noticed_not_stored_twice(tmp_path):
    async def scenario():
        here, there = _services(tmp_path), _services(tmp_path)  # two server processes, one database
        try:
            run_id = await _open(here)
            await here.pipeline.submit(run_id, _batch(1, [0]))
            assert (await there.pipeline.submit(run_id, _batch(2, [1])))["last_step"] == 1
            # This process's cache still says seq 1: the claim finds seq 2 taken.
            assert await here.pipeline.submit(run_id, _batch(2, [1])) == {"duplicate": True}
            assert (await here.pipeline.submit(run_id, _batch(3, [2])))["last_step"] == 2
            assert _loss_steps(here, run_id) == [0, 1, 2]
        finally:
            here.close()
            there.close()

    run_async(scenario())


def test_a_deleted_run_is_invalidated_and_its_batches_refused(tmp_path):
    async def scenario():
        services = _services(tmp_path)
        try:
            run_id = await _open(services)
            await services.pipeline.submit(run_id, _batch(1, [0]))
            assert await retention.delete_run_in_slices(services, run_id)
            assert not services.pipeline.cached(run_id)
            assert await services.pipeline.submit(run_id, _batch(2, [1])) == {"deleted": True}
        finally:
            services.close()

    run_async(scenario())


def test_a_failed_group_commit_drops_every_cache_and_stores_the_good_batch_once(tmp_path):
    async def scenario():
        services = _services(tmp_path)
        try:
            pipeline, writer = services.pipeline, services.writer
            run_id = await _open(services)
            await pipeline.submit(run_id, _batch(1, [0]))
            assert writer.on_group_failure == pipeline.invalidate_all  # the composition root's wiring
            failures = []
            writer.on_group_failure = lambda: (failures.append(1), pipeline.invalidate_all())
            hold = threading.Event()
            writer.submit(lambda _conn: hold.wait(10))  # the writer waits: the next two form one group
            good = pipeline.submit(run_id, _batch(2, [1]))

            def bad(_conn):
                raise RuntimeError("a batch the database refuses")

            failing = asyncio.wrap_future(writer.submit(bad, group=True))
            hold.set()
            assert (await good)["last_step"] == 1
            assert isinstance((await asyncio.gather(failing, return_exceptions=True))[0], RuntimeError)
            assert failures == [1] and _loss_steps(services, run_id) == [0, 1]
            assert await pipeline.submit(run_id, _batch(3, [2])) is not None
            assert _loss_steps(services, run_id) == [0, 1, 2]
        finally:
            services.close()

    run_async(scenario())


def test_a_points_push_is_encoded_once_and_carries_the_runs_last_step(tmp_path):
    async def scenario():
        services = _services(tmp_path)
        try:
            run_id = await _open(services)
            pages = [services.hub.subscribe(run_id) for _ in range(3)]
            result = await services.pipeline.submit(run_id, _batch(1, [5, 2, 7], loss=math.nan))
            services.pipeline.publish(run_id, result)
            texts = [page.get_nowait() for page in pages]
            return texts
        finally:
            services.close()

    texts = run_async(scenario())
    assert all(t is texts[0] for t in texts)  # one string for every page
    push = json.loads(texts[0])
    assert push["type"] == "points" and push["last_step"] == 7
    assert push["series"]["loss"] == {
        "steps": [5, 2, 7],
        "values": ["NaN", "NaN", "NaN"],
        "wall_times": [1005.0, 1002.0, 1007.0],
    }


def test_vector_rows_are_base64_float64_with_their_missing_slots():
    values = np.array([[1.0, 2.0, 3.0], [4.0, math.nan, 6.0]])
    missing = np.array([[False, False, False], [False, True, True]])
    stored = {"grad": ("vector", np.array([3, 4]), np.array([1.0, 2.0]), Column(None, values, missing))}
    push = points_message(1, stored, 4)
    rows = push["vectors"]["grad"]["values"]
    assert [np.frombuffer(base64.b64decode(r["f64"]), "<f8").tolist()[0] for r in rows] == [1.0, 4.0]
    assert "missing" not in rows[0] and rows[1]["missing"] == [1, 2]
    assert push["vectors"]["grad"]["steps"] == [3, 4] and push["last_step"] == 4


def test_a_push_travels_to_other_processes_as_encoded_or_by_reference():
    fanout = PgFanout(None, None)
    message = {"type": "points", "run_id": 3, "series": {"loss": {"steps": [1, 2]}}, "vectors": {}, "last_step": 2}
    note = json.loads(fanout.payload(3, message, encoded=json.dumps(message)))
    assert note == {"o": fanout.origin, "c": 3, "m": message}
    big = {**message, "series": {"loss": {"steps": list(range(MAX_PAYLOAD))}}}
    ref = json.loads(fanout.payload(3, big, encoded=json.dumps(big)))["r"]
    assert ref == {"type": "points", "run_id": 3, "keys": ["loss"], "lo": 0, "hi": MAX_PAYLOAD - 1, "last_step": 2}


def test_a_batch_knows_its_oldest_and_newest_step_and_whether_they_increase_in_both_wire_forms():
    for steps in ([], [7], [3, 4, 9], [5, 5], [9, 2, 4], list(range(200)), [*range(100), 50]):
        records = [(s, 1000.0 + i, {"loss": 0.5}, {}) for i, s in enumerate(steps)]
        columns = decode({"type": "batch", "seq": 1, "columns": protocol.encode_columns(records)})
        wire = [{"step": s, "t": t, "scalars": sc} for s, t, sc, _v in records]
        old_form = decode({"type": "batch", "seq": 1, "records": wire})
        want = (min(steps), max(steps)) if steps else (None, None)
        rising = all(a < b for a, b in zip(steps, steps[1:]))
        made = Batch(1, np.array(steps, dtype=np.int64), np.arange(len(steps), dtype=np.float64))
        for batch in (columns, old_form, made):  # both wire forms, and a Batch built directly
            assert (batch.oldest, batch.newest) == want and batch.ascending == rising, steps
            assert batch.steps.tolist() == steps


def test_the_run_clock_of_increasing_batches_equals_the_clock_of_any_batches():
    from gradwatch_server.storage.blocks.clock import Clock

    rng = np.random.default_rng(7)
    fast, general = Clock(1), Clock(1)
    start = 0
    for _ in range(300):
        # increasing steps, sometimes overlapping the clock's newest (a resend after a reconnect)
        start = max(0, start - int(rng.integers(0, 3)))
        steps = np.cumsum(rng.integers(1, 3, int(rng.integers(0, 5)))) + start
        walls = rng.random(len(steps)) + steps
        fast.observe(steps, walls, ascending=True)
        general.observe(steps, walls)
        start = int(steps[-1]) if len(steps) else start
        assert fast.last == general.last
        assert fast.steps.tolist() == general.steps.tolist()
        assert fast.walls.view(np.int64).tolist() == general.walls.view(np.int64).tolist()


def test_one_group_of_runs_goes_to_the_writer_once_every_live_links_batch_is_held_many_groups_wait_the_hold(tmp_path):
    async def scenario():
        services, links = _services(tmp_path), [20]
        try:
            pipeline, writer = services.pipeline, services.writer
            runs = await _live_runs(services, 20, links)
            futures = [pipeline.submit(r, _batch(1, [0, 1])) for r in runs[:19]]
            held_before = writer.held()
            futures.append(pipeline.submit(runs[19], _batch(1, [0, 1])))  # the 20th of 20 links: the group is whole
            held_after = writer.held()
            await asyncio.gather(*futures)
            links[0] = 300  # 8 groups: which runs' batches come together is not known here, so the hold runs out
            futures = [pipeline.submit(r, _batch(2, [2])) for r in runs]
            held_many = writer.held()
            await asyncio.gather(*futures)
            return held_before, held_after, held_many, [_loss_steps(services, r) for r in runs]
        finally:
            services.close()

    held_before, held_after, held_many, steps = run_async(scenario())
    assert (held_before, held_after, held_many) == (19, 0, 20)
    assert steps == [[0, 1, 2]] * 20
