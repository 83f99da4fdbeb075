"""False alarms the issue reported, fixed: a layer frozen mid-run while the link is busy (the layout change
and the vectors around it in one batch), through the real ingest path on a real SQLite file; and the client
never putting vectors of two layouts in one batch. (The converged run's floors are in the corpus.)"""

from __future__ import annotations

import json

from test_health_corpus import PACE, _freeze, regression
from test_ingest import _setup

from gradwatch import protocol
from gradwatch.values import Encoder
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode


def _one_batch(items: list) -> dict:
    """A real run's records and layouts as ONE records-form batch (an older client on a loaded machine):
    the records before the freeze are wider than the layout the batch carries."""
    records, layouts = [], {}
    for item in items:
        if item[0] == "layout":
            layouts[item[1]] = item[2]
        elif item[0] == "rec":
            _, step, scalars, vecs = item
            records.append(
                {
                    "step": step,
                    "t": 1000.0 + step,
                    "scalars": {k: protocol.encode_float(v) for k, v in scalars.items()},
                    "vectors": {
                        k: [None if x is None else protocol.encode_float(x) for x in v] for k, v in vecs.items()
                    },
                }
            )
    return {"type": "batch", "seq": 1, "records": records, "layouts": layouts}


def test_a_layer_frozen_mid_run_in_one_batch_raises_nothing(tmp_path):
    run = regression(5, before=_freeze(30, 0, True), steps=60)
    items = run.records()
    widths = {len(i[3]["grad"]) for i in items if i[0] == "rec" and "grad" in i[3]}
    assert len(widths) == 2  # the freeze really changed the layout inside the batch
    engine, run_id = _setup(tmp_path)
    with engine.begin() as conn:
        state = load_state(conn, run_id)
        out = apply_batch(conn, state, decode(_one_batch(items)))
    assert [a["kind"] for a in out["alerts"] if a["kind"] not in PACE] == [], out["alerts"]


def test_a_layer_that_really_has_no_gradient_is_still_caught_in_one_batch(tmp_path):
    # The same batch shape, but one slot of the new layout stays None: that one is a missing gradient.
    run = regression(5, before=_freeze(30, 0, True), steps=60)
    items = run.records()
    for i, item in enumerate(items):
        if item[0] == "rec" and item[1] >= 30 and "grad" in item[3]:
            vec = list(item[3]["grad"])
            vec[0] = None
            items[i] = (item[0], item[1], item[2], {**item[3], "grad": vec})
    engine, run_id = _setup(tmp_path)
    with engine.begin() as conn:
        out = apply_batch(conn, load_state(conn, run_id), decode(_one_batch(items)))
    assert [a["kind"] for a in out["alerts"] if a["kind"] not in PACE] == ["missing_gradients"], out["alerts"]


def test_the_client_starts_a_new_batch_at_a_layout_change():
    rec = lambda step, width: ("rec", step, 1000.0 + step, {"loss": 1.0}, {"grad": ([1.0] * width, [], width)})  # noqa: E731
    items = [("layout", "grad", ["a", "b", "c"]), rec(0, 3), rec(1, 3), ("layout", "grad", ["b", "c"]), rec(2, 2)]
    batches = Encoder().encode(items, 1, set())
    assert [n for _, _, n in batches] == [2, 1]
    assert json.loads(batches[1][1])["layouts"] == {"grad": ["b", "c"]}
