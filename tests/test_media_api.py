"""Histograms, images, tables and run.summary through a real server: ingest, the read API, refusals, deletion."""

from __future__ import annotations

import base64
import json
import urllib.request

import numpy as np
import pytest
import torch
from sqlalchemy import select

import gradwatch
from gradwatch import protocol
from gradwatch.media import Histogram, Image, Table, png, route
from gradwatch.media.histogram_group import HistogramGroup
from gradwatch_server.ingest import media as media_ingest
from gradwatch_server.storage import database, db
from gradwatch_server.storage.media import rows as media_store

ONE_PIXEL = base64.b64encode(png.encode(b"\x00", 1, 1, 1)).decode()


def logged_run(server, steps=6):
    run = gradwatch.init(project="media", name="m", server=server.url)
    for step in range(steps):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        x = torch.randn(2000) + step
        x[:step] = float("nan")
        route.put(
            run.recorder,
            step,
            {
                "weights": Histogram(x, num_bins=32),
                "samples": [
                    Image(np.full((4, 5, 3), step * 40, dtype=np.uint8), caption=f"step {step}"),
                    Image(torch.rand(1, 3, 3)),
                ],
                "preds": Table(columns=["i", "p"], data=[[i, i * step / 10] for i in range(3)]),
            },
        )
    run.recorder.put_event({"type": "summary", "set": {"best": 0.5, "nested": {"a": [1, 2]}}, "remove": []})
    run.recorder.put_event({"type": "config", "config": {"lr": 0.01}})
    run.finish()
    return run.id


def test_media_are_stored_and_read_back(server, api):
    run_id = logged_run(server)
    kinds = {m["key"]: (m["kind"], m["steps"]) for m in api.get(f"/api/runs/{run_id}/media")}
    assert kinds == {"weights": ("histogram", 6), "samples": ("image", 6), "preds": ("table", 6)}
    hist = api.get(f"/api/runs/{run_id}/histograms?key=weights")
    assert hist["total_steps"] == 6 and [h["step"] for h in hist["histograms"]] == list(range(6))
    assert [h["nan"] for h in hist["histograms"]] == list(range(6))
    assert all(sum(h["counts"]) + h["nan"] == 2000 and h["lo"] < h["hi"] for h in hist["histograms"])
    assert hist["histograms"][5]["lo"] > hist["histograms"][0]["lo"]  # the distribution moved with the steps
    thinned = api.get(f"/api/runs/{run_id}/histograms?key=weights&max_steps=3")["histograms"]
    assert [h["step"] for h in thinned][0] == 0 and thinned[-1]["step"] == 5 and len(thinned) == 3
    images = api.get(f"/api/runs/{run_id}/images?key=samples&step=3")
    assert images["step"] == 3 and images["steps"] == list(range(6))
    first = images["images"][0]
    assert (first["width"], first["height"], first["caption"]) == (5, 4, "step 3")
    with urllib.request.urlopen(f"{server.url}/api/runs/{run_id}/images/{first['id']}.png") as resp:
        assert resp.headers["Content-Type"] == "image/png" and resp.read()[:4] == b"\x89PNG"
    table = api.get(f"/api/runs/{run_id}/tables?key=preds&step=2")
    assert table["columns"] == ["i", "p"] and table["rows"][2] == [2, 0.4]
    assert api.get(f"/api/runs/{run_id}/summary") == {"best": 0.5, "nested": {"a": [1, 2]}}
    assert api.get(f"/api/runs/{run_id}")["config"]["lr"] == 0.01


def test_an_image_is_served_only_through_its_own_run(server, api):
    a, b = logged_run(server, 1), logged_run(server, 1)
    image_id = api.get(f"/api/runs/{a}/images?key=samples")["images"][0]["id"]
    status, _ = api.request("GET", f"/api/runs/{b}/images/{image_id}.png")
    assert status == 404
    status, _ = api.request("GET", f"/api/runs/{a}/tables?key=weights")
    assert status == 404


def test_deleting_a_run_deletes_its_media(server, api):
    run_id = logged_run(server, 2)
    status, _ = api.request("DELETE", f"/api/runs/{run_id}")
    assert status == 200
    with server.services.engine.connect() as conn:
        left = [conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar() for t in ("media", "run_summary")]
    assert left == [0, 0]


def test_bad_entries_are_refused_one_by_one():
    limits = media_ingest.MediaLimits(table_rows=10, bins=8)
    good = {"step": 1, "t": 1.0, "key": "ok", "kind": "text", "value": {"text": "x"}}
    bad = [
        {**good, "kind": "video"},
        {**good, "step": -1},
        {**good, "kind": "image", "value": {"images": [{"png": base64.b64encode(b"GIF89a").decode()}]}},
        {**good, "kind": "histogram", "value": {"lo": 0, "hi": 1, "counts": [1] * 9}},
        {**good, "kind": "histogram", "value": {"lo": "NaN", "hi": 1, "counts": [1]}},
        {**good, "kind": "table", "value": {"columns": ["a"], "rows": [[1]] * 11}},
        {**good, "kind": "table", "value": {"columns": ["a"], "rows": [[{"nested": 1}]]}},
    ]
    for entry in bad:
        try:
            media_ingest.rows_of(entry, limits)
        except (protocol.ProtocolError, ValueError):
            continue
        raise AssertionError(f"accepted {entry}")
    assert media_ingest.rows_of({**good, "kind": "image", "value": {"images": [{"png": ONE_PIXEL}]}}, limits)[0]["meta"]


def test_a_batch_with_bad_media_stores_the_rest(server, api):
    from websockets.sync.client import connect

    url = server.url.replace("http", "ws") + protocol.INGEST_PATH
    with connect(url) as ws:
        ws.send(protocol.dumps(protocol.hello({"uid": "raw-media", "project": "media", "name": "raw"})))
        welcome = json.loads(ws.recv())
        assert protocol.MEDIA in welcome["features"]
        entries = [
            {"step": 0, "t": 1.0, "key": "good", "kind": "text", "value": {"text": "replaced"}},
            {"step": 0, "t": 1.0, "key": "good", "kind": "text", "value": {"text": "kept"}},  # same key and step: last
            {"step": 0, "t": 1.0, "key": "bad", "kind": "image", "value": {"images": [{"png": "!!"}]}},
        ]
        ws.send(protocol.dumps(protocol.batch(1, [], media=entries)))
        ack = json.loads(ws.recv())
    assert ack["seq"] == 1 and "media 2" in ack["refused"]
    run_id = welcome["run_id"]
    assert [m["key"] for m in api.get(f"/api/runs/{run_id}/media")] == ["good"]
    assert api.get(f"/api/runs/{run_id}/tables?key=good")["text"] == "kept"
    assert any(a["kind"] == "data_refused" for a in api.get(f"/api/runs/{run_id}/alerts"))


def test_packed_histogram_counts_are_stored_as_the_list_form_and_an_older_server_refuses_them():
    from gradwatch.contract import wire

    entry = {"step": 3, "t": 1.0, "key": "h", "kind": "histogram", "value": {"lo": -1.0, "hi": 1.0, "nan": 2}}
    plain = media_ingest.rows_of(
        {**entry, "value": {**entry["value"], "counts": [16, 0, 48]}}, media_ingest.MediaLimits()
    )
    packed_value = {**entry["value"], "counts": wire.encode_counts([1, 0, 3], 16)}
    packed = media_ingest.rows_of({**entry, "value": packed_value}, media_ingest.MediaLimits())
    assert packed == plain and np.frombuffer(packed[0]["body"], "<i8").tolist() == [16, 0, 48]
    older = media_ingest.MediaLimits(features=frozenset({protocol.MEDIA}))  # wire_features without histogram_packed
    try:
        media_ingest.rows_of({**entry, "value": packed_value}, older)
    except protocol.ProtocolError:
        assert media_ingest.rows_of({**entry, "value": {**entry["value"], "counts": [16, 0, 48]}}, older) == plain
    else:
        raise AssertionError("a server without histogram_packed took packed counts")


def test_a_watch_capture_travels_as_one_packed_group_only_where_the_server_announced_it():
    from gradwatch.media.outgoing import Outbound

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.Linear(64, 3))
    with torch.no_grad():
        model[1].bias[0] = float("nan")  # a row binned on its own, inside the group
    stored = {}
    for features in (set(protocol.SERVER_FEATURES), {protocol.MEDIA}):
        out = Outbound()
        items = [out.item(0, f"p/{n}", Histogram(p, num_bins=16, sample=1024)) for n, p in model.named_parameters()]
        entries, gaps = out.encode(items, features)
        assert not gaps and len(entries) == (1 if protocol.HISTOGRAM_PACKED in features else 4)
        rows = [r for e in json.loads(json.dumps(entries)) for r in media_ingest.rows_of(e, media_ingest.MediaLimits())]
        stored[len(entries)] = {
            r["key"]: (json.loads(r["meta"]), np.frombuffer(r["body"], "<i8").tolist()) for r in rows
        }
    assert stored[1] == stored[4]  # the group is stored as the histograms one by one are
    arrays = [(f"p/{n}", p) for n, p in model.named_parameters()]
    limits = media_ingest.MediaLimits()
    for features in (set(protocol.SERVER_FEATURES), {protocol.MEDIA}, None):  # None: spooled before any welcome
        out = Outbound()
        entries, gaps = out.encode([out.item(0, "p/0.weight", HistogramGroup(arrays, 16, 1024))], features)
        assert not gaps and len(entries) == (1 if features and protocol.HISTOGRAM_PACKED in features else 4)
        rows = [r for e in json.loads(json.dumps(entries)) for r in media_ingest.rows_of(e, media_ingest.MediaLimits())]
        grouped = {r["key"]: (json.loads(r["meta"]), np.frombuffer(r["body"], "<i8").tolist()) for r in rows}
        assert grouped == stored[1]  # watch()'s HistogramGroup: the same rows, packed or one by one
    halves = [(f"p/{n}", p.detach().to(torch.bfloat16)) for n, p in model.named_parameters()]  # not for numpy
    for tensors in (halves, [(f"p/{n}", p) for n, p in model.named_parameters()]):
        stored_as = []
        one_by_one = [Histogram(t, num_bins=16, sample=1024) for _k, t in tensors]
        for on_device in (None, True):  # True: stacked and binned by torch ops, as on a GPU
            for items in ([HistogramGroup(tensors, 16, 1024, on_device)], one_by_one):
                out = Outbound()
                entries, _ = out.encode(
                    [out.item(0, k, v) for (k, _t), v in zip(tensors, items)], set(protocol.SERVER_FEATURES)
                )
                rows = [r for e in json.loads(json.dumps(entries)) for r in media_ingest.rows_of(e, limits)]
                stored_as.append({r["key"]: (json.loads(r["meta"]), np.frombuffer(r["body"], "<i8")) for r in rows})
        assert all(len(one) == 4 for one in stored_as)
        for one in stored_as[1:]:
            assert {k: (m, c.tolist()) for k, (m, c) in one.items()} == {
                k: (m, c.tolist()) for k, (m, c) in stored_as[0].items()
            }  # the same rows, whichever path binned them
    meta, counts = stored[1]["p/1.bias"]
    assert meta["nan"] == 1 and sum(counts) == 2
    for name, param in model.named_parameters():
        meta, counts = stored[1][f"p/{name}"]
        assert abs(sum(counts) + meta["nan"] - param.numel()) < 8 * 64  # sampled counts scaled back to the size
    older = media_ingest.MediaLimits(features=frozenset({protocol.MEDIA}))
    out = Outbound()
    items = [out.item(0, f"p/{n}", Histogram(p, num_bins=16)) for n, p in model.named_parameters()]
    (group,), _ = out.encode(items, set(protocol.SERVER_FEATURES))
    try:
        media_ingest.rows_of(group, older)
    except protocol.ProtocolError:
        return
    raise AssertionError("a server without histogram_packed took a packed group")


def stored_media(engine, run_id) -> list[tuple]:
    m = db.media.c
    with engine.connect() as conn:
        rows = conn.execute(select(m.key, m.kind, m.step, m.idx, m.meta, m.body, m.nbytes).where(m.run_id == run_id))
        return sorted((k, kind, s, i, meta, bytes(body), n) for k, kind, s, i, meta, body, n in rows)


def check_store_replaces(engine) -> None:
    """Histograms upserted, images deleted first: a key logged again at a step replaces what it held there."""
    with engine.begin() as conn:
        run_id = conn.execute(
            db.runs.insert().values(
                uid=f"store-{engine.dialect.name}",
                project="m",
                name="r",
                status="running",
                created_at=0.0,
                updated_at=0.0,
            )
        ).inserted_primary_key[0]

    def row(key, kind, step, body, idx=0, meta="{}"):
        return {"key": key, "kind": kind, "step": step, "idx": idx, "wall": 1.0, "meta": meta, "body": body}

    def store(rows):
        with engine.begin() as conn:
            media_store.store(conn, run_id, rows)

    store([row("h", "histogram", 0, b"\1" * 8), row("h", "histogram", 1, b"\2" * 8)])
    store([row("h", "histogram", 1, b"\3" * 16, meta='{"lo": 1}'), row("h", "histogram", 2, b"\4" * 8)])
    store([row("pics", "image", 5, b"a", i) for i in range(3)])
    store([row("pics", "image", 5, b"b")])  # logged again with one image: the other two go
    assert stored_media(engine, run_id) == [
        ("h", "histogram", 0, 0, "{}", b"\1" * 8, 8),
        ("h", "histogram", 1, 0, '{"lo": 1}', b"\3" * 16, 16),  # replaced in place, its size with it
        ("h", "histogram", 2, 0, "{}", b"\4" * 8, 8),
        ("pics", "image", 5, 0, "{}", b"b", 1),
    ]
    with engine.connect() as conn:
        assert media_store.run_bytes(conn, run_id) == 33


def test_a_media_row_logged_again_replaces_the_old_one_on_sqlite(tmp_path):
    check_store_replaces(database.make_engine(f"sqlite:///{tmp_path}/m.db"))


def test_a_media_row_logged_again_replaces_the_old_one_on_postgres(postgres_url):
    engine = database.make_engine(postgres_url)
    try:
        check_store_replaces(engine)
    finally:
        engine.dispose()


def histogram_steps(api, run_id: int) -> dict:
    """{key: {step: histogram}} of every histogram key of a run."""
    out = {}
    for m in api.get(f"/api/runs/{run_id}/media"):
        hist = api.get(f"/api/runs/{run_id}/histograms?key={m['key']}")["histograms"]
        out[m["key"]] = {h["step"]: h for h in hist}
    return out


def test_watch_histograms_are_taken_at_the_optimizer_step_with_accumulation_and_unused_parameters(server, api):
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.ModuleDict({"body": nn.Linear(8, 16), "head": nn.Linear(16, 1), "spare": nn.Linear(16, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = gradwatch.init(project="media", name="accumulation", server=server.url)
    run.watch(model, opt, every=2, histograms="all", system_every=None)
    seen = {}  # step -> what the optimizer got: the accumulated gradient, the weights before the update
    for step in range(6):
        opt.zero_grad()
        for micro in range(3):  # gradient accumulation: three backward passes a step
            out = model["body"](torch.randn(4, 8)).relu()
            out = model["spare"](out) if step % 3 == 0 else model["head"](out)  # spare: steps 0 and 3 only
            out.pow(2).mean().backward()
            if micro == 0:
                first = model["body"].weight.grad.clone()
        seen[step] = {
            n: (p.grad.clone() if p.grad is not None else None, p.detach().clone()) for n, p in model.named_parameters()
        }
        seen[step]["first"] = first
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # after the capture: the histogram is pre-clip
        opt.step()
    run.finish()
    got = histogram_steps(api, run.id)
    assert sorted(got["gradients/body.weight"]) == [0, 2, 4]  # every 2nd optimizer step, not every 2nd backward
    assert sorted(got["gradients/spare.weight"]) == sorted(got["parameters/spare.weight"]) == [0]  # unused: none
    assert sorted(got["gradients/head.bias"]) == sorted(got["parameters/head.bias"]) == [2, 4]
    for step in (0, 2, 4):
        grad, weight = seen[step]["body.weight"]
        hist, weights = got["gradients/body.weight"][step], got["parameters/body.weight"][step]
        assert (hist["lo"], hist["hi"]) == pytest.approx((grad.min().item(), grad.max().item()), rel=1e-6)
        assert hist["hi"] != pytest.approx(seen[step]["first"].max().item(), rel=1e-3)  # all three micro-batches
        assert (weights["lo"], weights["hi"]) == pytest.approx((weight.min().item(), weight.max().item()), rel=1e-6)
        assert sum(hist["counts"]) == sum(weights["counts"]) == grad.numel()
        truth = np.histogram(grad.numpy(), bins=64, range=(hist["lo"], hist["hi"]))[0]
        assert np.abs(np.array(hist["counts"]) - truth).sum() <= 2  # float32 rounding at bin edges only


def test_watch_histograms_without_an_optimizer_count_backward_passes_and_take_the_first_of_a_step(server, api):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    run = gradwatch.init(project="media", name="no-optimizer", server=server.url)
    run.watch(model, histograms=True, every=2, system_every=None)
    expected, passes = {}, 0
    for step in range(4):
        model.zero_grad()
        for _ in range(3):  # three backward passes per logged step; passes 0, 2, 4, ... are sampled
            model(torch.randn(3, 8)).pow(2).mean().backward()
            if passes % 2 == 0 and step not in expected:  # a second sampled pass in the same step is skipped
                expected[step] = model.weight.grad.clone()
            passes += 1
        run.log({"loss": 1.0}, step=step)
    run.finish()
    got = histogram_steps(api, run.id)
    assert set(got) == {"gradients/weight", "gradients/bias"}  # histograms=True: gradients only
    assert sorted(got["gradients/weight"]) == [0, 1, 2, 3]
    for step, grad in expected.items():
        hist = got["gradients/weight"][step]
        assert (hist["lo"], hist["hi"]) == pytest.approx((grad.min().item(), grad.max().item()), rel=1e-6)
