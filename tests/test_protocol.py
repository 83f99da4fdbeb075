"""The shared wire protocol: exact non-finite floats, version checks, record validation."""

import math

import pytest

from gradwatch import protocol


@pytest.mark.parametrize("value", [0.0, -1.5, 1e308, 5e-324, math.inf, -math.inf])
def test_floats_round_trip_exactly(value):
    assert protocol.decode_float(protocol.loads(protocol.dumps({"type": "x", "v": protocol.encode_float(value)}))["v"]) == value


def test_nan_round_trips_and_frames_are_strict_json():
    text = protocol.dumps({"type": "x", "v": protocol.encode_float(math.nan)})
    assert '"NaN"' in text and math.isnan(protocol.decode_float(protocol.loads(text)["v"]))
    with pytest.raises(ValueError):
        protocol.dumps({"type": "x", "v": math.nan})  # raw NaN never reaches the wire


def test_version_mismatch_is_a_clear_error():
    with pytest.raises(protocol.ProtocolError, match="protocol version mismatch"):
        protocol.check_hello({"type": "hello", "protocol": 99, "run": {"uid": "a"}})
    assert protocol.check_hello(protocol.hello({"uid": "a"}))["uid"] == "a"


@pytest.mark.parametrize("record, message", [
    ({"step": -1, "t": 0}, "step"), ({"step": 1.5, "t": 0}, "step"), ({"step": 0, "t": "x"}, "record.t"),
    ({"step": 0, "t": 0, "scalars": {"": 1}}, "metric key"), ({"step": 0, "t": 0, "scalars": {"a": "nan"}}, "expected"),
    ({"step": 0, "t": 0, "scalars": {"a": None}}, "no value"), ({"step": 0, "t": 0, "vectors": {"g": 3}}, "list"),
])
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
