"""Compressed blocks read back bit-exact, and a damaged block is caught, reported and contained."""

from __future__ import annotations

import logging
import math
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update

from gradwatch import protocol
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.storage import chunks, database, db, store
from gradwatch_server.storage.blocks import arrays, codec, decimal

# None: the default, which picks one frame or one per byte plane (PLANES), whichever is smaller.
COMPRESSORS = [codec.RAW, codec.ZLIB, None] + ([codec.ZSTD, codec.PLANES] if codec.zstandard is not None else [])
# Odd NaNs (quiet and signalling, with payloads and sign), infinities, zeros of both signs, denormals.
SPECIAL = [0x7FF8000000000001, 0xFFF0000000000123, 0x7FF4000000000000, 0x7FF0000000000000, 0xFFF0000000000000]
SPECIAL += [0x8000000000000000, 0, 1, 0x000FFFFFFFFFFFFF]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint64)


@st.composite
def streams(draw):
    """Random blocks: steps anywhere in int64, wall times and values of any bit pattern, mostly realistic."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n, width = draw(st.integers(1, 300)), draw(st.sampled_from([1, 1, 3, 17]))
    kind = draw(st.sampled_from(["steady", "wild", "float32", "specials", "decimal", "decimal specials"]))
    if kind == "wild":
        steps = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
        walls = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True).view(np.float64)
        values = rng.integers(0, 2**64 - 1, (n, width), dtype=np.uint64, endpoint=True).view(np.float64)
    else:
        steps = np.sort(rng.integers(0, 3 * n, n)).astype(np.int64) + 2**40 * (kind == "steady")
        walls = 1.76e9 + np.cumsum(rng.exponential(0.1, n))
        values = rng.normal(1, 0.1, (n, width))
        if kind.startswith("decimal"):  # born decimals (a rounded timer, a typed 0.1034), big and small
            values = np.round(values * 10.0 ** rng.integers(-3, 9), int(rng.integers(0, 12)))
        elif kind != "steady":
            values = values.astype(np.float32).astype(np.float64)
    if kind.endswith("specials"):
        pick = rng.random((n, width)) < 0.3
        special = np.array(SPECIAL, dtype=np.uint64)[rng.integers(0, len(SPECIAL), (n, width))].view(np.float64)
        values = np.where(pick, special, values)
    missing = rng.random((n, width)) < draw(st.sampled_from([0.0, 0.0, 0.1, 1.0]))
    return steps, walls, values, missing


@settings(max_examples=150, deadline=None)
@given(streams(), st.sampled_from(COMPRESSORS))
def test_a_chunk_reads_back_bit_exact(stream, compressor):
    steps, walls, values, missing = stream
    blob = codec.encode_chunk(steps, walls, values, missing, compressor)
    assert codec.is_encoded(blob) and codec.width_of(blob) == values.shape[1]
    got_steps, got_walls, got_values, got_missing = codec.decode_chunk(blob)
    assert (got_steps == steps).all()
    assert (_bits(got_walls) == _bits(walls)).all()
    assert (_bits(got_values) == _bits(values)).all()
    assert (got_missing if got_missing is not None else np.zeros_like(missing)).tolist() == missing.tolist()
    # The same chunk with its wall times left to the run clock: everything else exact, and no walls stored.
    clocked = codec.encode_chunk(steps, None, values, missing, compressor)
    got_steps, got_walls, got_values, got_missing = codec.decode_chunk(clocked)
    assert got_walls is None and (got_steps == steps).all() and (_bits(got_values) == _bits(values)).all()
    assert (got_missing if got_missing is not None else np.zeros_like(missing)).tolist() == missing.tolist()
    if compressor == codec.RAW:
        assert len(clocked) < len(blob) - 8 * len(steps) + 8


@settings(max_examples=100, deadline=None)
@given(streams())
def test_a_summary_array_reads_back_bit_exact(stream):
    data = np.ascontiguousarray(stream[2][:12])  # up to 12 rows of any values
    data[1::3] = -1.0  # rows of "no such step" (left out of the blob), and one almost so
    data[2:3, :1] = -0.999999
    for got in (
        arrays.decode_array(arrays.encode_array(data)),
        arrays.decode_arrays([arrays.encode_array(data)] * 2, *data.shape)[1],
    ):
        assert (_bits(got) == _bits(data)).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([32, 300]))
def test_a_wide_summary_with_palette_rows_reads_back_bit_exact_alone_and_in_bulk(seed, width):
    """A vector's summary: wall-time rows with a few distinct values (palettes), NaN payloads among them."""
    rng = np.random.default_rng(seed)
    walls = 1.76e9 + rng.normal(0, 1, 16)
    walls[0] = np.array(SPECIAL[0], dtype=np.uint64).view(np.float64)  # a NaN with a payload
    data = np.vstack(
        [
            rng.normal(size=(7, width)).astype(np.float32),
            walls[rng.integers(0, 16, (3, width))],
            rng.normal(size=(2, width)),
        ]
    )
    data[11, : width // 2] = walls[rng.integers(0, 16, width // 2)]  # half a palette's worth: stays plain
    blob = arrays.encode_array(data)
    assert (_bits(arrays.decode_array(blob)) == _bits(data)).all()
    other = arrays.encode_array(data[:, ::-1].copy())
    both = arrays.decode_arrays([blob, other, blob], 12, width)
    assert (_bits(both[0]) == _bits(data)).all() and (_bits(both[1]) == _bits(data[:, ::-1])).all()
    one = arrays.decode_arrays([other, blob], 12, width, slot=width - 1)
    assert (_bits(one[1, :, 0]) == _bits(data[:, -1])).all() and (_bits(one[0, :, 0]) == _bits(data[:, 0])).all()
    for cut in range(1, len(blob), 7):
        with pytest.raises(codec.Corrupt):
            arrays.decode_array(blob[:cut])
    for i in range(16, len(blob), 11):
        damaged = bytearray(blob)
        damaged[i] ^= 0x10
        assert arrays.decode_arrays([bytes(damaged)], 12, width) is None


def test_float32_born_values_take_half_the_bytes_of_float64_noise():
    rng = np.random.default_rng(0)
    n = 2048
    steps, walls = np.arange(n, dtype=np.int64), 1.76e9 + np.arange(n) * 0.1
    born32 = rng.normal(2, 0.1, (n, 1)).astype(np.float32).astype(np.float64)
    size32 = len(codec.encode_chunk(steps, walls, born32, None, codec.ZLIB))
    size64 = len(codec.encode_chunk(steps, walls, rng.normal(2, 0.1, (n, 1)), None, codec.ZLIB))
    assert size32 < 0.6 * size64 and size32 < 3.5 * n  # steps and a steady clock cost next to nothing
    constant = len(codec.encode_chunk(steps, walls, np.full((n, 1), 3e-4), None, codec.ZLIB))
    assert constant < 200
    cosine = (3e-4 * 0.5 * (1 + np.cos(np.pi * np.arange(n) / 1e5)))[:, None]  # smooth float64: delta-of-delta wins
    blob = codec.encode_chunk(steps, walls, cosine, None, codec.ZLIB)
    assert len(blob) < 4.5 * n and (_bits(codec.decode_chunk(blob)[2]) == _bits(cosine)).all()


def test_decimals_are_stored_as_their_integers_and_read_back_bit_exact():
    rng = np.random.default_rng(2)
    n = 2048
    steps = np.arange(n, dtype=np.int64)
    timer = np.round(0.1 + rng.exponential(0.002, n), 6)[:, None]  # gradwatch's step timer, at 1 us
    rate = np.array([float(f"{r:.4g}") for r in 5000 + rng.normal(0, 50, n)])[:, None]  # 4 digits
    for values, most in ((timer, 2.2), (rate, 1.4), (rate * 1000, 1.4)):
        blob = codec.encode_chunk(steps, None, values, None, codec.ZLIB)
        assert len(blob) < most * n and (_bits(codec.decode_chunk(blob)[2]) == _bits(values)).all()
        noisy = codec.encode_chunk(steps, None, values + rng.normal(0, 1e-9, (n, 1)), None, codec.ZLIB)
        assert len(noisy) > 2 * len(blob)  # the same values off the decimal grid: the float transforms
    for odd in (-0.0, 2.0**60, 1e-300):  # one value that is no short decimal: exact all the same
        values = timer.copy()
        values[n // 2] = odd
        assert (_bits(codec.decode_chunk(codec.encode_chunk(steps, None, values))[2]) == _bits(values)).all()


def _decimal_in_order(values: np.ndarray):
    """decimal.find as first written: each exponent tried on the sample in turn (the oracle of its one-pass form)."""
    if values.size == 0 or not np.isfinite(values).all():
        return None
    sample = values.ravel()[:: max(1, values.size // 16)]
    with np.errstate(all="ignore"):
        for e in range(decimal.MAX_EXPONENT + 1):
            scaled = np.rint(sample * 10.0**e)
            if np.abs(scaled).max() >= 2.0**52:
                return None
            if not (decimal.restore(scaled.astype("<i8"), e, 0).view("<i8") == sample.view("<i8")).all():
                continue
            full = np.rint(values * 10.0**e)
            if np.abs(full).max() >= 2.0**52:
                return None
            if (decimal.restore(full.astype("<i8"), e, 0).view("<i8") == values.view("<i8")).all():
                return e
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 22),
    st.sampled_from(["digits", "mixed", "huge", "tiny", "off grid"]),
    st.integers(1, 200),
)
def test_decimals_are_found_at_the_exponent_trying_them_in_order_finds(seed, digits, kind, n):
    rng = np.random.default_rng(seed)
    values = np.round(rng.normal(0, 10.0 ** rng.integers(-3, 8), n), digits)
    if kind == "mixed":  # some values at a finer grid than the rest: the sample may pass where the block fails
        values[rng.integers(0, n)] += 10.0 ** -min(22, digits + 2)
    elif kind == "huge":
        values *= 10.0 ** rng.integers(5, 15)
    elif kind == "tiny":
        values *= 10.0 ** -int(rng.integers(5, 15))
    elif kind == "off grid":
        values = values + rng.normal(0, 1e-9, n)
    found = decimal.find(values)
    want = _decimal_in_order(values)
    assert (None if found is None else found[0]) == want
    if found is not None:
        e, factor, ints = found
        assert (decimal.restore(ints.view("<i8"), e, factor).view("<i8") == values.view("<i8")).all()


def _first_release_chunk(steps: np.ndarray, values: np.ndarray, transform: int) -> bytes:
    """A one-slot chunk as the first release wrote it, walls left to the run clock, uncompressed (the format by hand)."""
    shuffle = lambda a: np.ascontiguousarray(a.view(np.uint8).reshape(-1, 8).T).tobytes()  # noqa: E731
    with np.errstate(over="ignore"):
        dod = np.diff(np.diff(steps, prepend=np.int64(0)), prepend=np.int64(0))
        raw = np.ascontiguousarray(values[:, 0]).view("<u8")
        bits = {
            codec.T_NONE: raw,
            codec.T_XOR: raw ^ np.r_[np.uint64(0), raw[:-1]],
            codec.T_DOD: np.diff(np.diff(raw, prepend=np.uint64(0)), prepend=np.uint64(0)),
        }[transform]
    body = shuffle(((dod << 1) ^ (dod >> 63)).view("<u8")) + shuffle(bits)
    pad = (5 - (16 + len(body))) % 8
    head = struct.pack("<BBHII", codec.CHUNK, codec.RAW | codec.CLOCK | (pad << 5), transform, len(steps), 1)
    crc = zlib.crc32(bytes(pad), zlib.crc32(body, zlib.crc32(head)))
    return head + struct.pack("<I", crc) + body + bytes(pad)


def test_blocks_written_with_the_first_transforms_keep_their_meaning():
    values = np.random.default_rng(3).normal(1, 0.1, (50, 1))
    steps = np.arange(50, dtype=np.int64)
    for transform in (codec.T_NONE, codec.T_XOR, codec.T_DOD):
        got_steps, walls, got, _missing = codec.decode_chunk(_first_release_chunk(steps, values, transform))
        assert walls is None and (got_steps == steps).all() and (_bits(got) == _bits(values)).all()


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_every_flipped_bit_and_every_cut_is_detected(compressor):
    rng = np.random.default_rng(1)
    values = rng.normal(size=(40, 3))
    values[5, 1] = math.nan
    blob = codec.encode_chunk(np.arange(40), 1e9 + np.arange(40.0), values, values > 1.5, compressor)
    for i in range(len(blob)):
        for bit in (0, 3, 7):
            damaged = bytearray(blob)
            damaged[i] ^= 1 << bit
            with pytest.raises(codec.Corrupt):
                codec.decode_chunk(bytes(damaged))
    for cut in range(1, len(blob)):
        with pytest.raises(codec.Corrupt):
            codec.decode_chunk(blob[:cut])


def _ingest(engine, steps: int) -> int:
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "c1", "project": "p", "name": "n"}, {})["run_id"]
        state = load_state(conn, run_id)
    records = [(i, 1000.0 + i, {"loss": 1.0 / (1 + i), "lr": 0.1}, {"grad": [1.0, 2.0 + i % 3]}) for i in range(steps)]
    msg = {"type": "batch", "seq": 1, "columns": protocol.encode_columns(records), "layouts": {"grad": ["a", "b"]}}
    with engine.begin() as conn:
        apply_batch(conn, state, decode(msg))
    return run_id


def test_a_corrupt_chunk_costs_only_its_own_points_and_is_reported(tmp_path, caplog):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    run_id = _ingest(engine, 3 * chunks.CHUNK_VALUES + 100)
    with engine.begin() as conn:
        key_id = conn.execute(select(db.metric_keys.c.id).where(db.metric_keys.c.key == "loss")).scalar()
        c = db.chunks.c
        victim = conn.execute(
            select(c.id, c.data, c.n).where(c.key_id == key_id, c.n == chunks.CHUNK_VALUES).order_by(c.id)
        ).first()
        assert codec.is_encoded(victim.data)  # full chunks are written compressed
        damaged = bytearray(victim.data)
        damaged[len(damaged) // 2] ^= 0x10
        conn.execute(update(db.chunks).where(c.id == victim.id).values(data=bytes(damaged)))
    total = 3 * chunks.CHUNK_VALUES + 100
    with caplog.at_level(logging.ERROR, logger="gradwatch.server"), engine.connect() as conn:
        loss = store.get_series(conn, run_id, "loss")
        envelope = store.get_series(conn, run_id, "loss", max_points=200)
        lr = store.get_series(conn, run_id, "lr")
        heat = store.get_heatmap(conn, run_id, "grad", max_steps=50)
    assert len(loss["steps"]) == total - victim.n  # the damaged block's points, and only those, are gone
    assert envelope["steps"] and len(lr["steps"]) == total and lr["values"] == [0.1] * total
    assert len(heat["values"]) == 2 and heat["steps"]
    report = [r.getMessage() for r in caplog.records if "corrupt chunk" in r.getMessage()]
    assert len(report) == 1 and f"run {run_id}" in report[0] and "'loss'" in report[0]


def test_a_damaged_run_clock_costs_only_wall_times_and_is_never_overwritten(tmp_path, caplog):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    run_id = _ingest(engine, chunks.CHUNK_VALUES + 100)
    with engine.begin() as conn:
        tail = conn.execute(select(db.run_clock.c.id, db.run_clock.c.data)).one()
        damaged = bytearray(tail.data)
        damaged[len(damaged) // 2] ^= 0x10
        conn.execute(update(db.run_clock).where(db.run_clock.c.id == tail.id).values(data=bytes(damaged)))
        state = load_state(conn, run_id)  # a restart: the writer must not grow or overlap the damaged row
    start = chunks.CHUNK_VALUES + 100
    records = [
        (i, 1000.0 + i, {"loss": 1.0 / (1 + i), "lr": 0.1}, {}) for i in range(start, start + 2 * chunks.CHUNK_VALUES)
    ]
    msg = {"type": "batch", "seq": 2, "columns": protocol.encode_columns(records)}
    with engine.begin() as conn:
        apply_batch(conn, state, decode(msg))
    with caplog.at_level(logging.ERROR, logger="gradwatch.server"), engine.connect() as conn:
        lr = store.get_series(conn, run_id, "lr")
        assert conn.execute(select(db.run_clock.c.data).where(db.run_clock.c.id == tail.id)).scalar() == bytes(damaged)
    walls = np.array(lr["wall_times"], dtype=float)
    assert lr["values"] == [0.1] * len(lr["steps"]) and lr["steps"] == list(range(start + 2 * chunks.CHUNK_VALUES))
    assert np.isnan(walls[: chunks.CHUNK_VALUES]).all()  # the clocked chunk lost its walls, not its values
    assert (walls[start:] == 1000.0 + np.arange(start, start + 2 * chunks.CHUNK_VALUES)).all()
    assert any("corrupt run clock" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(codec.zstandard is None, reason="PLANES needs zstd")
def test_a_wide_chunk_takes_one_frame_per_byte_plane_where_smaller_and_every_damage_is_caught():
    rng = np.random.default_rng(4)
    values = (np.exp(rng.normal(-2, 1, 40)) * (1 + rng.normal(0, 0.1, (48, 40)))).astype(np.float32).astype(float)
    values[7, 3] = np.frombuffer(np.uint64(0x7FF8_0000_0000_0042).tobytes(), "<f8")[0]  # a NaN with a payload
    values[9, :2] = math.inf, -math.inf
    steps, missing = np.arange(48), np.zeros(values.shape, bool)
    blob = codec.encode_chunk(steps, None, values, missing)
    assert blob[1] & 3 == codec.PLANES and len(blob) < len(codec.encode_chunk(steps, None, values, missing, codec.ZSTD))
    assert (_bits(codec.decode_chunk(blob)[2]) == _bits(values)).all()
    for i in range(len(blob)):
        damaged = bytearray(blob)
        damaged[i] ^= 1 << (i % 8)
        with pytest.raises(codec.Corrupt):
            codec.decode_chunk(bytes(damaged))
    for cut in range(1, len(blob), 7):
        with pytest.raises(codec.Corrupt):
            codec.decode_chunk(blob[:cut])


@pytest.mark.parametrize("steps,slots", [(4, 3), (16, 3), (16, 8), (64, 2)])
def test_a_small_wide_chunk_is_never_bigger_than_one_frame_of_it(steps, slots):
    rng = np.random.default_rng(steps * slots)
    values = (np.exp(rng.normal(-2, 1, slots)) * (1 + rng.normal(0, 0.1, (steps, slots)))).astype(np.float32)
    values = values.astype(float)
    one_frame = codec.encode_chunk(np.arange(steps), None, values, None, codec.ZSTD)
    blob = codec.encode_chunk(np.arange(steps), None, values, None)
    assert len(blob) <= len(one_frame) and (_bits(codec.decode_chunk(blob)[2]) == _bits(values)).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.sampled_from([(12, 1), (6, 1), (12, 3), (2, 40), (12, 33)]), max_size=40))
def test_summaries_encoded_together_are_the_blobs_each_makes_alone(seed, shapes):
    rng = np.random.default_rng(seed)
    summaries = []
    for rows, width in shapes:
        data = rng.normal(0, 10.0 ** rng.integers(-5, 5), (rows, width))
        for r in range(rows):  # rows that are float32-born, absent ("no such step"), odd bit patterns or noise
            pick = rng.integers(0, 4)
            if pick == 0:
                data[r] = data[r].astype(np.float32)
            elif pick == 1:
                data[r] = -1.0
            elif pick == 2:
                data[r] = np.array(SPECIAL, dtype=np.uint64)[rng.integers(0, len(SPECIAL), width)].view(np.float64)
        summaries.append(data)
    assert arrays.encode_arrays(summaries) == [arrays.encode_array(data) for data in summaries]
