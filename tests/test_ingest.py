"""The ingest path on a real SQLite file: a server restart keeps the health rules' memory."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from gradwatch import protocol
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.storage import chunks, database, db, store

LAYERS = ["in.weight", "in.bias", "out.weight", "out.bias"]


def _batch(seq, steps, norm, layer_norms, loss=1.0):
    records = [
        {
            "step": s,
            "t": 1000.0 + s,
            "scalars": {"loss": protocol.encode_float(loss), "grad/global_norm": protocol.encode_float(norm)},
            "vectors": {"grad": [protocol.encode_float(v) for v in layer_norms]},
        }
        for s in steps
    ]
    return decode({"type": "batch", "seq": seq, "records": records, "layouts": {"grad": LAYERS}})


def _setup(tmp_path, alerts=None):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'ingest.db'}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "u1", "project": "p", "name": "n"}, alerts or {})["run_id"]
    return engine, run_id


def _apply(engine, state, msg):
    with engine.begin() as conn:
        return [a["kind"] for a in apply_batch(conn, state, msg)["alerts"]]


def _apply_full(engine, state, msg):
    with engine.begin() as conn:
        return apply_batch(conn, state, msg)["alerts"]


def _restart(engine, run_id):
    with engine.begin() as conn:
        return load_state(conn, run_id)


def test_baseline_survives_a_restart_so_an_explosion_is_caught_at_once(tmp_path):
    engine, run_id = _setup(tmp_path)
    assert _apply(engine, _restart(engine, run_id), _batch(1, range(30), 1.0, [1.0] * 4)) == []
    # 500 is under the absolute ceiling: only the run's own history says it exploded.
    assert _apply(engine, _restart(engine, run_id), _batch(2, [30], 500.0, [1, 1, 1, 500.0])) == ["exploding_gradients"]


def test_an_episode_alerted_before_a_restart_is_not_alerted_again(tmp_path):
    # The loss is flat on purpose (this is about gradient episodes): the plateau rule waits past these 200 steps.
    engine, run_id = _setup(tmp_path, alerts={"loss_plateau.patience": 10_000})
    state = _restart(engine, run_id)
    dead = [0.0, 0.0, 1.0, 1.0]  # input layer dead for good
    assert _apply(engine, state, _batch(1, range(25), 1.0, dead)) == ["zero_gradients"]
    assert _apply(engine, _restart(engine, run_id), _batch(2, range(25, 60), 1.0, dead)) == []
    # ... while a new episode after the restart still is.
    alive = [1.0] * 4
    assert _apply(engine, _restart(engine, run_id), _batch(3, range(60, 160), 1.0, alive)) == []
    # A recurrence is folded into the stored alert: one card, counted twice, with the latest step.
    again = _apply_full(engine, _restart(engine, run_id), _batch(4, range(160, 200), 1.0, dead))
    assert [(a["kind"], a["count"], a["step"] < 25) for a in again] == [("zero_gradients", 2, True)]
    assert again[0]["last_step"] >= 160


def test_replay_reads_only_the_recent_steps(tmp_path):
    engine, run_id = _setup(tmp_path)
    _apply(engine, _restart(engine, run_id), _batch(1, range(5000), 1.0, [1.0] * 4))
    state = _restart(engine, run_id)
    window = state.monitor.states["spike"]["loss"]["window"]
    assert 0 < len(window) <= 100 and state.last_step == 4999


def test_small_rows_left_by_a_restart_are_still_merged(tmp_path):
    """Live batches of one step each, the server 'restarting' every 5 batches: the small rows of every
    restart are merged into full chunks later, not left small for good."""
    from sqlalchemy import func, select

    engine, run_id = _setup(tmp_path)
    layers = [f"l{i}" for i in range(300)]  # a 300-slot vector: a full chunk is 64 steps
    for seq in range(1, 141):
        if seq % 5 == 1:
            state = _restart(engine, run_id)
        msg = decode(
            {
                "type": "batch",
                "seq": seq,
                "layouts": {"grad": layers} if seq == 1 else {},
                "records": [{"step": seq - 1, "t": float(seq), "scalars": {}, "vectors": {"grad": [float(seq)] * 300}}],
            }
        )
        with engine.begin() as conn:
            apply_batch(conn, state, msg)
    with engine.connect() as conn:
        key_id = conn.execute(select(db.metric_keys.c.id).where(db.metric_keys.c.key == "grad")).scalar()
        rows = conn.execute(select(func.count()).select_from(db.chunks).where(db.chunks.c.key_id == key_id)).scalar()
        full = conn.execute(
            select(func.count()).select_from(db.chunks).where(db.chunks.c.key_id == key_id, db.chunks.c.n == 64)
        ).scalar()
        from gradwatch_server.storage import store

        assert store.get_series(conn, run_id, "grad/l7")["steps"] == list(range(140))
    assert full == 2 and rows == 2 + 12  # two full chunks and the 12 newest steps still small


def test_the_preferred_gap_is_zero_when_the_writer_idles_and_grows_with_its_load(tmp_path):
    import time

    from gradwatch_server.ingest.pipeline import MAX_GAP, Pipeline
    from gradwatch_server.services import Services
    from gradwatch_server.settings import Settings

    services = Services(Settings(db=f"sqlite:///{tmp_path / 'gap.db'}"))
    try:
        pipeline: Pipeline = services.pipeline
        assert pipeline.preferred_gap() == 0.0
        time.sleep(0.55)
        services.writer.busy_seconds += 60.0  # a writer busy all of the last half second (however long it took)
        assert pipeline.preferred_gap() == MAX_GAP
        start = time.perf_counter()  # the busy share is of the time that really passed (a loaded machine sleeps longer)
        time.sleep(0.55)
        services.writer.busy_seconds += (time.perf_counter() - start) * 0.75  # three quarters: half way to the longest
        assert abs(pipeline.preferred_gap() - MAX_GAP / 2) < 0.02
        time.sleep(0.55)  # idle again
        assert pipeline.preferred_gap() == 0.0
    finally:
        services.close()


def test_many_live_links_share_a_frame_budget_and_a_lone_link_is_never_delayed(tmp_path):
    from gradwatch.contract import LINK_MIN_GAP
    from gradwatch_server.ingest.pipeline import FRAME_BUDGET, MAX_GAP, PHASES, TICK_SLACK
    from gradwatch_server.services import Services
    from gradwatch_server.settings import Settings

    services = Services(Settings(db=f"sqlite:///{tmp_path / 'gap.db'}"))
    links = [1]
    services.pipeline.links = lambda: links[0]
    try:
        assert services.pipeline.preferred_gap() == 0.0  # one run: sent at once
        links[0] = 5
        assert services.pipeline.preferred_gap() == round(5 / FRAME_BUDGET, 3)
        links[0] = 300
        assert services.pipeline.preferred_gap() == MAX_GAP  # never longer: a point reaches a page in < 250 ms
        assert services.liveness.connected_clients() == 0  # the real count, wired in by Services
        links[0] = 20  # a 0.2 s period: each gap runs to the next tick, so the links' batches arrive together
        assert services.pipeline.preferred_gap(received=100.05) == 0.15
        assert services.pipeline.preferred_gap(received=100.37) == LINK_MIN_GAP  # 30 ms: sooner than a link sends
        # read 5 ms before its tick: sent for it (the client counts from its send): its next goes at the tick after
        assert services.pipeline.preferred_gap(received=100.395) == round(MAX_GAP + 0.005, 3)
        assert services.pipeline.hold() <= MAX_GAP / PHASES - TICK_SLACK  # so a point's way stays as bounded
        # 20 links are one group of runs: they tick together (run back to back: Pipeline.hold)
        assert services.pipeline.preferred_gap(received=100.10, run_id=2) == 0.1
        links[0] = 300  # 8 groups of ~37, spread over the period: run 2's group ticks 50 ms after run 0's
        assert services.pipeline.preferred_gap(received=100.05) == 0.15
        assert services.pipeline.preferred_gap(received=100.10, run_id=2) == 0.15
        assert services.pipeline.preferred_gap(received=100.10, run_id=10) == 0.15  # 10 % 8: run 2's group
    finally:
        services.close()


def test_a_run_that_ends_leaves_each_key_one_compressed_small_row(tmp_path):
    from gradwatch_server.storage.blocks import codec

    engine, run_id = _setup(tmp_path)
    state = _restart(engine, run_id)
    for seq in range(1, 40):  # live-shaped: a step a batch, each a raw small row
        _apply(engine, state, _batch(seq, [seq], 1.0, [1.0, 2.0, 3.0, float(seq)]))
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM chunks").scalar() > 39
    end = _batch(40, [40], 1.0, [1.0] * 4)
    end.events.append({"type": "status", "status": "finished"})
    _apply(engine, state, end)
    with engine.connect() as conn:
        rows = conn.execute(select(db.chunks.c.key_id, db.chunks.c.data, db.chunks.c.n)).all()
        grad = store.get_series(conn, run_id, "grad/out.bias")
    assert sorted(r.key_id for r in rows) == sorted({r.key_id for r in rows})  # one row a key
    assert all(codec.is_encoded(r.data) and r.n == 40 for r in rows)
    assert grad["steps"] == list(range(1, 41)) and grad["values"] == [float(s) for s in range(1, 40)] + [1.0]


@st.composite
def _clock_streams(draw):
    """Records of a run: steps mostly rising (some repeated with another wall time, some going back),
    keys logged at different steps, split into batches of random sizes, with restarts between some."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 2600))
    steady = draw(st.booleans())
    jumps = np.ones(n, dtype=np.int64) if steady else rng.choice([1, 1, 1, 1, 1, 1, 0, -7], n)
    steps = np.maximum(0, np.cumsum(jumps)).astype(int)
    walls = 1.76e9 + steps * 0.1 + rng.normal(0, 1e-3, n)
    records = []
    for i, (step, wall) in enumerate(zip(steps.tolist(), walls.tolist())):
        scalars = {"loss": protocol.encode_float(float(rng.normal(1, 0.1)))}
        if i % 3 == 0:
            scalars["lr"] = protocol.encode_float(1e-3)
        if i % 50 == 7:
            scalars["rare"] = protocol.encode_float(float(rng.choice([np.nan, np.inf, -0.0, 2.5])))
        record = {"step": step, "t": wall, "scalars": scalars}
        if i % 2 == 0:
            record["vectors"] = {"grad": [protocol.encode_float(float(v)) for v in rng.random(4)]}
        records.append(record)
    cuts = sorted(set(rng.integers(1, max(2, n), draw(st.integers(0, 30))).tolist()) | {n})
    restarts = set(rng.integers(0, len(cuts), 3).tolist()) if draw(st.booleans()) else set()
    return records, cuts, restarts, draw(st.booleans()), steady


def _expected(records) -> dict:
    """key -> [(step, wall bits, value bits)] in step order (repeated steps in arrival order), as stored."""
    out: dict = {}
    for r in records:
        for key, v in r["scalars"].items():
            out.setdefault(key, []).append((r["step"], r["t"], protocol.decode_float(v)))
        for i, v in enumerate(r.get("vectors", {}).get("grad", [])):
            out.setdefault(f"grad/{LAYERS[i]}", []).append((r["step"], r["t"], protocol.decode_float(v)))
    bits = lambda x: np.float64(x).view(np.int64).item()  # noqa: E731
    return {k: sorted([(s, bits(w), bits(v)) for s, w, v in pts], key=lambda p: p[0]) for k, pts in out.items()}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_clock_streams())
def test_a_run_clock_keeps_every_wall_time_bit_exact(stream):
    """Chunks that leave their walls to the run clock read back exactly what was sent, across restarts,
    repeated steps with other wall times, steps going back, sparse keys and a run that ends."""
    from gradwatch_server.storage import chunks
    from gradwatch_server.storage.blocks import codec

    records, cuts, restarts, ends, steady = stream
    with tempfile.TemporaryDirectory() as tmp:
        engine, run_id = _setup(Path(tmp))
        state, at = _restart(engine, run_id), 0
        for seq, cut in enumerate(cuts, 1):
            msg = decode({"type": "batch", "seq": seq, "records": records[at:cut], "layouts": {"grad": LAYERS}})
            if ends and cut == cuts[-1]:
                msg.events.append({"type": "status", "status": "finished"})
            _apply(engine, state, msg)
            at = cut
            if seq in restarts:
                state = _restart(engine, run_id)
        with engine.connect() as conn:
            keys = dict(conn.execute(select(db.metric_keys.c.key, db.metric_keys.c.id)).all())
            got = {}
            for key, want in _expected(records).items():
                name, slot = (key, None) if not key.startswith("grad/") else ("grad", LAYERS.index(key[5:]))
                p = chunks.read(conn, keys[name], column=slot) if slot is not None else chunks.read(conn, keys[name])
                got[key] = list(
                    zip(p.steps.tolist(), p.walls.view(np.int64).tolist(), p.values[:, 0].view(np.int64).tolist())
                )
                assert got[key] == want, key
            blobs = [r.data for r in conn.execute(select(db.chunks.c.data)) if codec.is_encoded(r.data)]
        engine.dispose()
    clocked = [b for b in blobs if codec.decode_chunk(b)[1] is None]
    if len(records) >= 2100 and steady:  # a full loss chunk at least: its walls are the clock's
        assert clocked


@pytest.mark.parametrize("n_keys", [4, 70])  # a statement a row (few rows, SQLite); more than one multi-row insert
def test_every_key_of_one_step_batches_reads_back_its_own_points_once_its_small_rows_merge(
    tmp_path, monkeypatch, n_keys
):
    """A batch's small rows (one per key) go in as few statements as pay; each key's tail must hold its own row ids."""
    monkeypatch.setattr(chunks, "CHUNK_VALUES", 16)  # full chunks of 16 steps: merges come soon
    engine, run_id = _setup(tmp_path)
    keys = [f"k{i}" for i in range(n_keys)]
    steps = range(chunks.capacity(1) + 5)  # past a full chunk: the small rows are merged (deleted by id)

    def logged(i):  # keys start at different steps, so their small rows are merged at different batches
        return [s for s in steps if s >= i % 5]

    state = _restart(engine, run_id)
    for s in steps:
        scalars = {k: float(i * 1000 + s) for i, k in enumerate(keys) if s in logged(i)}
        with engine.begin() as conn:
            batch = {"type": "batch", "seq": s + 1, "records": [{"step": s, "t": 1000.0 + s, "scalars": scalars}]}
            apply_batch(conn, state, decode(batch))
    with engine.connect() as conn:
        for i, key in enumerate(keys):
            points = chunks.read(conn, state.key_ids[key], slots=1)
            assert points.steps.tolist() == logged(i)
            assert points.values[:, 0].tolist() == [float(i * 1000 + s) for s in logged(i)]
