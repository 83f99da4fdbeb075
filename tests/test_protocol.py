"""The shared wire protocol: exact non-finite floats, version checks, record validation."""

import json
import math

import pytest

from gradwatch import protocol


@pytest.mark.parametrize("value", [0.0, -1.5, 1e308, 5e-324, math.inf, -math.inf])
def test_floats_round_trip_exactly(value):
    assert (
        protocol.decode_float(protocol.loads(protocol.dumps({"type": "x", "v": protocol.encode_float(value)}))["v"])
        == value
    )


def test_nan_round_trips_and_frames_are_strict_json():
    text = protocol.dumps({"type": "x", "v": protocol.encode_float(math.nan)})
    assert '"NaN"' in text and math.isnan(protocol.decode_float(protocol.loads(text)["v"]))
    with pytest.raises(ValueError):
        protocol.dumps({"type": "x", "v": math.nan})  # raw NaN never reaches the wire


def test_version_mismatch_is_a_clear_error():
    with pytest.raises(protocol.ProtocolError, match="protocol version mismatch"):
        protocol.check_hello({"type": "hello", "protocol": 99, "run": {"uid": "a"}})
    assert protocol.check_hello(protocol.hello({"uid": "a"}))["uid"] == "a"


@pytest.mark.parametrize(
    "record, message",
    [
        ({"step": -1, "t": 0}, "step"),
        ({"step": 1.5, "t": 0}, "step"),
        ({"step": 0, "t": "x"}, "record.t"),
        ({"step": 0, "t": 0, "scalars": {"": 1}}, "metric key"),
        ({"step": 0, "t": 0, "scalars": {"a": "nan"}}, "expected"),
        ({"step": 0, "t": 0, "scalars": {"a": None}}, "no value"),
        ({"step": 0, "t": 0, "vectors": {"g": 3}}, "list"),
    ],
)
def test_bad_records_are_rejected_with_reason(record, message):
    with pytest.raises(protocol.ProtocolError, match=message):
        protocol.decode_record(record)


def test_vector_slots_keep_none_apart_from_nan():
    _, _, _, vectors = protocol.decode_record({"step": 0, "t": 1.0, "vectors": {"grad": [1.0, None, "NaN"]}})
    assert vectors["grad"][1] is None and math.isnan(vectors["grad"][2])


def test_loads_rejects_non_objects():
    for frame in ("[1]", "nope", '{"no": "type"}'):
        with pytest.raises(protocol.ProtocolError):
            protocol.loads(frame)


def test_batch_text_equals_dumping_the_whole_batch():
    records = [
        {"step": i, "t": 1.5, "scalars": {"loss": protocol.encode_float(v)}}
        for i, v in enumerate([1.0, float("nan"), float("inf")])
    ]
    layouts = {"grad": ['odd "records":[] name']}
    events = [{"type": "status", "status": "running"}]
    text = protocol.batch_text(7, [protocol.dumps(r) for r in records], layouts, events)
    assert protocol.loads(text) == protocol.batch(7, records, layouts, events)
    assert protocol.loads(protocol.batch_text(1, [])) == protocol.batch(1, [])


def test_binary_vectors_round_trip_exactly_with_missing_slots():
    values = [1.5, math.nan, math.inf, -math.inf, None, 1e-300, -0.0]
    wire = protocol.encode_vector_f64(values)
    assert wire["missing"] == [4] and json.loads(protocol.dumps(wire)) == wire  # strict JSON
    back = protocol.decode_vector(wire)
    assert back[0] == 1.5 and math.isnan(back[1]) and back[2:4] == [math.inf, -math.inf]
    assert back[4] is None and back[5] == 1e-300 and math.copysign(1, back[6]) == -1
    assert "missing" not in protocol.encode_vector_f64([1.0, 2.0])
    record = {"step": 3, "t": 1.0, "scalars": {}, "vectors": {"grad": wire}}
    assert protocol.decode_record(record)[3]["grad"][4] is None


@pytest.mark.parametrize(
    "bad",
    [
        {"f64": "not base64!"},
        {"f64": "AAAA"},
        {"f64": "", "missing": [0]},
        {"f64": protocol.encode_vector_f64([1.0])["f64"], "missing": ["0"]},
        {"b64": ""},
        3,
    ],
)
def test_bad_binary_vectors_are_refused_clearly(bad):
    with pytest.raises(protocol.ProtocolError, match="vector 'grad'"):
        protocol.decode_record({"step": 0, "t": 1.0, "vectors": {"grad": bad}})


@pytest.mark.parametrize(
    ("counts", "scale", "form"),
    [
        ([0, 3, 65535], 1, "u16"),
        ([1, 65536], 1, "u32"),
        ([4096, 0, 7], 16, "u16"),
        ([1 << 32, 1], 1, None),
        ([5], 1, "u16"),
    ],
)
def test_histogram_counts_round_trip_packed_in_the_narrowest_form(counts, scale, form):
    from gradwatch.contract import wire

    packed = wire.encode_counts(counts, scale)
    assert (next(iter(packed)) if isinstance(packed, dict) else None) == form
    assert wire.decode_counts(json.loads(json.dumps(packed))) == [c * scale for c in counts]
    assert wire.decode_counts([c * scale for c in counts]) == [c * scale for c in counts]  # the list form, as before


@pytest.mark.parametrize(
    "bad",
    [{"u16": "not base64!"}, {"u32": "AAA="}, {"u16": "AAA=", "scale": 0}, {"u16": "AAA=", "u32": "AAAAAA=="},
     {"u16": "AAA=", "extra": 1}, {"u8": "AA=="}, [1, -1], [1.5], [True], "1,2"],
)  # fmt: skip
def test_bad_histogram_counts_are_refused_clearly(bad):
    from gradwatch.contract import wire

    with pytest.raises(protocol.ProtocolError, match="histogram counts"):
        wire.decode_counts(bad)
