"""The ingest websocket against a real server, spoken to frame by frame: what is stored, refused and answered."""

from __future__ import annotations

import json
import math

import pytest
from conftest import Api, run_async, wait_runs
from websockets.exceptions import ConnectionClosedError
from websockets.sync.client import connect

from gradwatch import protocol


def ingest_url(server_url: str) -> str:
    return "ws" + server_url[len("http") :] + protocol.INGEST_PATH


class Link:
    """A raw ingest connection: hello, then batches; replies read one by one."""

    def __init__(self, server_url: str, uid: str = "u-1", secret: str = "s-1", **hello):
        self.ws = connect(ingest_url(server_url), max_size=None)
        run = {"uid": uid, "project": "p", "name": "n", "secret": secret, **hello.pop("run", {})}
        self.ws.send(json.dumps({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "run": run, **hello}))
        self.welcome = json.loads(self.ws.recv(timeout=10))

    def send(self, message) -> dict:
        """The reply, without an ack's ``gap``: a busy server's send-gap hint depends on the machine's load
        (its own tests: test_ingest.py, test_sender.py)."""
        self.ws.send(message if isinstance(message, str) else protocol.dumps(message))
        return without_gap(json.loads(self.ws.recv(timeout=10)))

    def close(self):
        self.ws.close()


def without_gap(reply: dict) -> dict:
    return {k: v for k, v in reply.items() if k != "gap"}


def _columns_batch(seq, records, **extra):
    return {"type": "batch", "seq": seq, "columns": protocol.encode_columns(records), **extra}


def test_columns_round_trip_nan_and_inf_exactly(server, api):
    link = Link(server.url)
    assert protocol.COLUMNS in link.welcome["features"]
    records = [
        (s, 1000.0 + s, {"loss": [1.5, math.nan, math.inf, -math.inf][s % 4]}, {"grad": [0.1 * s, None]})
        for s in range(40)
    ]
    reply = link.send(_columns_batch(1, records, layouts={"grad": ["a.weight", "b.weight"]}))
    assert reply == {"type": "ack", "seq": 1}
    run_id = link.welcome["run_id"]
    loss = api.get(f"/api/runs/{run_id}/series?key=loss")
    assert loss["steps"] == list(range(40)) and loss["values"][:4] == [1.5, "NaN", "Infinity", "-Infinity"]
    assert loss["wall_times"][:2] == [1000.0, 1001.0]
    layer = api.get(f"/api/runs/{run_id}/series?key=grad/b.weight")
    assert layer["values"][:3] == [None, None, None]  # no gradient: missing, not NaN
    assert api.get(f"/api/runs/{run_id}/series?key=grad/a.weight")["values"][3] == 0.30000000000000004
    link.close()


def test_a_bad_record_is_refused_and_the_rest_is_stored(server, api):
    link = Link(server.url)
    records = [
        {"step": 0, "t": 1.0, "scalars": {"loss": 1.0}},
        {"step": 1, "t": 2.0, "scalars": {"loss": 10**400}},  # beyond float range
        {"step": 2, "t": 3.0, "scalars": ["not", "an", "object"]},
        {"step": 3, "t": 4.0, "scalars": {"loss": 0.5, "\ud800bad": 1.0}},  # a lone surrogate key
        {"step": 4, "t": 5.0, "scalars": {"loss": 0.25}},
    ]
    reply = link.send({"type": "batch", "seq": 1, "records": records})
    assert reply["type"] == "ack" and reply["seq"] == 1 and "record 1" in reply["refused"]
    run_id = link.welcome["run_id"]
    assert api.get(f"/api/runs/{run_id}/series?key=loss")["steps"] == [0, 4]
    alerts = api.get(f"/api/runs/{run_id}/alerts")
    assert [a["kind"] for a in alerts] == ["data_refused"] and "record 2" in alerts[0]["message"]
    # ... and the next batch goes on as usual: nothing is stuck behind the refused part.
    assert link.send({"type": "batch", "seq": 2, "records": [{"step": 5, "t": 6.0, "scalars": {"loss": 0.1}}]}) == {
        "type": "ack",
        "seq": 2,
    }
    link.close()


def test_a_layout_change_inside_a_batch_stores_everything(server, api):
    """Old-width vectors beside a wider new layout (a layer appended mid-run) no longer block the run."""
    link = Link(server.url)
    records = [{"step": 0, "t": 1.0, "scalars": {"loss": 1.0}, "vectors": {"grad": [1.0, 2.0]}}]
    records += [
        {"step": s, "t": 1.0 + s, "scalars": {"loss": 1.0}, "vectors": {"grad": [1.0, 2.0, 3.0]}} for s in range(1, 300)
    ]
    reply = link.send({"type": "batch", "seq": 1, "records": records, "layouts": {"grad": ["a", "b", "c"]}})
    assert reply == {"type": "ack", "seq": 1}
    run_id = link.welcome["run_id"]
    assert len(api.get(f"/api/runs/{run_id}/series?key=loss")["steps"]) == 300
    assert api.get(f"/api/runs/{run_id}/series?key=grad/c")["values"][:2] == [None, 3.0]
    link.close()


def test_a_narrower_layout_after_freezing_keeps_both_widths_readable(server, api):
    link = Link(server.url)
    wide = [(s, 1.0 + s, {"loss": 1.0}, {"grad": [1.0, 2.0, 3.0]}) for s in range(10)]
    assert link.send(_columns_batch(1, wide, layouts={"grad": ["a", "b", "c"]}))["type"] == "ack"
    narrow = [(s, 1.0 + s, {"loss": 1.0}, {"grad": [5.0, 6.0]}) for s in range(10, 20)]
    assert link.send(_columns_batch(2, narrow, layouts={"grad": ["a", "b"]}))["type"] == "ack"
    run_id = link.welcome["run_id"]
    assert api.get(f"/api/runs/{run_id}/series?key=grad/b")["values"] == [2.0] * 10 + [6.0] * 10
    heat = api.get(f"/api/runs/{run_id}/heatmap?key=grad")
    assert heat["layers"] == ["a", "b"] and len(heat["values"]) == 2
    link.close()


def test_duplicates_are_acked_gaps_are_nacked(server, api):
    link = Link(server.url)
    batch = _columns_batch(1, [(0, 1.0, {"loss": 1.0}, {})])
    assert link.send(batch) == {"type": "ack", "seq": 1}
    assert link.send(batch) == {"type": "ack", "seq": 1}
    assert link.send(_columns_batch(3, [(2, 1.0, {"loss": 1.0}, {})])) == {"type": "nack", "expected": 2}
    assert api.get(f"/api/runs/{link.welcome['run_id']}/series?key=loss")["steps"] == [0]
    link.close()


def test_a_page_gets_each_batch_as_a_points_push_with_the_runs_last_step(server, api):
    link = Link(server.url)
    run_id = link.welcome["run_id"]
    with connect("ws" + server.url[len("http") :] + f"/ws/runs/{run_id}") as page:
        assert json.loads(page.recv(timeout=10))["type"] == "subscribed"
        assert link.send(_columns_batch(1, [(4, 1.0, {"loss": 1.0}, {}), (9, 2.0, {"loss": math.inf}, {})]))
        push = json.loads(page.recv(timeout=10))
        while push["type"] != "points":
            push = json.loads(page.recv(timeout=10))
    assert push["run_id"] == run_id and push["last_step"] == 9  # docs/api.md; the run page's header shows it
    assert push["series"]["loss"] == {"steps": [4, 9], "values": [1.0, "Infinity"], "wall_times": [1.0, 2.0]}
    link.close()


def test_another_client_cannot_resume_or_move_a_run_forward(server, api):
    owner = Link(server.url, uid="victim", secret="right")
    assert owner.send(_columns_batch(1, [(0, 1.0, {"loss": 1.0}, {})]))["type"] == "ack"
    owner.close()
    thief = connect(ingest_url(server.url))
    thief.send(
        json.dumps({"type": "hello", "protocol": 1, "run": {"uid": "victim", "secret": "guess"}, "resume_from": 10**9})
    )
    reply = json.loads(thief.recv(timeout=10))
    assert reply["type"] == "error" and "secret" in reply["message"]
    thief.close()
    again = Link(server.url, uid="victim", secret="right")
    assert again.welcome["acked_seq"] == 1  # the sequence did not move
    assert again.send(_columns_batch(2, [(1, 2.0, {"loss": 0.5}, {})])) == {"type": "ack", "seq": 2}
    assert api.get(f"/api/runs/{again.welcome['run_id']}/series?key=loss")["steps"] == [0, 1]
    again.close()


def test_a_deleted_run_tells_its_client_to_stop(server, api):
    link = Link(server.url)
    assert link.send(_columns_batch(1, [(0, 1.0, {"loss": 1.0}, {})]))["type"] == "ack"
    status, _ = api.request("DELETE", f"/api/runs/{link.welcome['run_id']}")
    assert status == 200
    reply = link.send(_columns_batch(2, [(1, 1.0, {"loss": 1.0}, {})]))
    assert reply["type"] == "error" and reply["code"] == "run_deleted"
    assert api.get("/api/runs") == []  # not recreated under a new id
    link.close()


def test_hostile_hellos_get_a_clear_error(server, api):
    for hello, expect in [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ({"type": "hello", "protocol": 1, "run": {"uid": "x", "name": ["no"]}}, "name must be a string"),
        ({"type": "hello", "protocol": 1, "run": {"uid": "x"}, "layouts": [1]}, "layouts"),
        ({"type": "hello", "protocol": 1, "run": {"uid": "x" * 65}}, "uid"),
    ]:
        ws = connect(ingest_url(server.url), max_size=None)
        ws.send(hello if isinstance(hello, str) else json.dumps(hello))
        reply = json.loads(ws.recv(timeout=10))
        assert reply["type"] == "error" and expect in reply["message"], (reply, expect)
        ws.close()
    assert api.get("/api/runs") == []


def test_a_bare_nan_in_the_config_is_stored_as_a_string(server, api):
    ws = connect(ingest_url(server.url))
    ws.send('{"type": "hello", "protocol": 1, "run": {"uid": "nan-cfg", "name": "\\ud800x", "config": {"lr": NaN}}}')
    assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
    wait_runs(api)
    run = api.get(f"/api/runs/{api.get('/api/runs')[0]['id']}")
    assert run["config"] == {"lr": "NaN"} and run["name"] == "?x"
    ws.close()


def test_a_frame_over_the_limit_is_refused_with_the_reason(server, api):
    link = Link(server.url)
    assert link.send(_columns_batch(1, [(0, 1.0, {"loss": 1.0}, {})]))["type"] == "ack"
    limit = server.settings.max_frame_bytes
    with pytest.raises(ConnectionClosedError) as refused:
        link.send('{"type": "batch", "seq": 2, "records": [], "pad": "' + "x" * limit + '"}')
    assert refused.value.rcvd.code == 1009 and "exceeds limit" in refused.value.rcvd.reason
    assert api.get(f"/api/runs/{link.welcome['run_id']}/series?key=loss")["steps"] == [0]  # nothing lost


def test_keys_over_the_run_limit_are_refused_and_reported(tmp_path):
    import dataclasses

    from conftest import Api

    from gradwatch_server.serve import BackgroundServer
    from gradwatch_server.settings import Settings

    settings = Settings(host="127.0.0.1", port=0, db=f"sqlite:///{tmp_path / 'k.db'}")
    srv = BackgroundServer(dataclasses.replace(settings, max_keys_per_run=3)).start()
    try:
        link = Link(srv.url)
        reply = link.send(_columns_batch(1, [(0, 1.0, {f"k{i}": 1.0 for i in range(5)}, {})]))
        assert "already has 3 keys" in reply["refused"]
        keys = Api(srv.url).get(f"/api/runs/{link.welcome['run_id']}/keys")
        assert len(keys) == 3
        link.close()
    finally:
        srv.stop()


def test_a_connection_holds_at_most_max_buffered_bytes():
    """Past the budget the route stops reading (back-pressure); one frame alone always fits."""
    assert run_async(_small_budget_scenario()) == 90


async def _small_budget_scenario():
    import asyncio

    from gradwatch_server.web.routes.ingest_ws import Budget

    alone = Budget(100)
    await asyncio.wait_for(alone.take(500), 1)  # any single frame fits (its size is capped by max_frame_bytes)
    budget = Budget(100)
    await budget.take(60)
    await budget.take(30)
    waiting = asyncio.ensure_future(budget.take(30))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    budget.give(60)
    await asyncio.wait_for(waiting, 1)
    return budget.used + 30


def test_try_take_takes_only_what_fits_now():
    """The route's no-wait path: the same verdict ``take`` would reach without waiting, and no change on no."""
    from gradwatch_server.web.routes.ingest_ws import Budget

    budget = Budget(100)
    assert budget.try_take(500) and budget.used == 500  # one frame alone always fits
    budget.give(500)
    assert budget.try_take(60) and budget.try_take(40) and budget.used == 100
    assert not budget.try_take(1) and budget.used == 100
    budget.give(60)
    assert budget.try_take(30) and budget.used == 70


def test_the_ack_text_is_protocol_dumps_of_the_ack():
    from gradwatch_server.web.routes.ingest_ws import ack_text

    for seq in (1, 7, 2**31, 2**63 - 1):
        assert ack_text(seq) == protocol.dumps({"type": "ack", "seq": seq})
        assert ack_text(seq, 0.0, None) == ack_text(seq, 0.0, "") == protocol.dumps({"type": "ack", "seq": seq})
        assert ack_text(seq, 0.25) == protocol.dumps({"type": "ack", "seq": seq, "gap": 0.25})
        both = {"type": "ack", "seq": seq, "gap": 1.5, "refused": 'record 1: \u00e9 "x"'}
        assert ack_text(seq, 1.5, both["refused"]) == protocol.dumps(both)
        assert ack_text(seq, 0.0, "r") == protocol.dumps({"type": "ack", "seq": seq, "refused": "r"})


def test_a_small_buffer_budget_still_stores_everything(tmp_path):
    import dataclasses

    from gradwatch_server.serve import BackgroundServer
    from gradwatch_server.settings import Settings

    settings = Settings(host="127.0.0.1", port=0, db=f"sqlite:///{tmp_path / 'b.db'}")
    srv = BackgroundServer(dataclasses.replace(settings, max_buffered_bytes=2000)).start()
    try:
        link = Link(srv.url)
        frames = [protocol.dumps(_columns_batch(seq, [(seq, 1.0, {"loss": float(seq)}, {})])) for seq in range(1, 41)]
        for frame in frames:  # pipelined: 40 frames of ~250 bytes against a 2,000-byte budget
            link.ws.send(frame)
        replies = [json.loads(link.ws.recv(timeout=10)) for _ in frames]
        assert [r["seq"] for r in replies] == list(range(1, 41))
        assert len(Api(srv.url).get(f"/api/runs/{link.welcome['run_id']}/series?key=loss")["steps"]) == 40
        link.close()
    finally:
        srv.stop()


class _StubSocket:
    """The route's side of a websocket: frames ready to read at once (a client far ahead), what it sent."""

    def __init__(self, frames, services):
        import types

        self.frames, self.sent, self.read, self.closed = list(frames), [], 0, None
        self.app = types.SimpleNamespace(state=types.SimpleNamespace(services=services))
        self.scope = {}  # no middleware ran: the open identity (web/roles.identity_of)

    async def accept(self):
        pass

    async def receive_text(self):
        import asyncio

        from fastapi import WebSocketDisconnect

        if self.read >= len(self.frames):
            await asyncio.sleep(3600)  # the client waits for its answers
            raise WebSocketDisconnect(1000)
        self.read += 1
        return self.frames[self.read - 1]

    async def send_text(self, text):
        self.sent.append(json.loads(text))

    async def close(self, code=1000, reason=None):
        self.closed = code


class _StubPipeline:
    """Batches whose writer results the test hands out one by one."""

    def __init__(self):
        self.pending = []

    async def open_run(self, info, resume, layouts):
        return {"run_id": 1, "acked_seq": 0}

    @staticmethod
    def decode(text):
        import types

        return types.SimpleNamespace(seq=json.loads(text)["seq"])

    def submit(self, run_id, batch):
        import asyncio

        self.pending.append(asyncio.get_running_loop().create_future())
        return self.pending[-1]

    def preferred_gap(self, received=None, run_id=0):
        return 0.0

    def publish(self, run_id, result):
        pass

    def synced(self):
        return None  # every commit on disk at once (no group fsync)


def _stub_route(frames, **settings):
    import types

    from gradwatch_server.settings import Settings
    from gradwatch_server.web.routes.ingest_ws import ingest

    pipeline = _StubPipeline()
    services = types.SimpleNamespace(
        pipeline=pipeline,
        engine=None,  # the open identity may write any run: the route never asks the database who made it
        liveness=types.SimpleNamespace(connect=lambda run_id: None, disconnect=lambda run_id: None),
        settings=Settings(max_buffered_bytes=64 << 20, max_frame_bytes=1 << 20, **settings),  # the real table
    )
    hello = protocol.dumps(
        {"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "run": {"uid": "u", "project": "p"}}
    )
    ws = _StubSocket([hello, *frames], services)
    return ws, pipeline, ingest(ws)


def test_a_full_reply_queue_stops_reading_and_answers_come_in_order():
    assert run_async(_full_queue_scenario()) == list(range(1, 61))


async def _full_queue_scenario():
    import asyncio

    from gradwatch_server.web.routes.ingest_ws import IN_FLIGHT

    frames = [protocol.dumps({"type": "batch", "seq": seq}) for seq in range(1, 61)]
    ws, pipeline, route = _stub_route(frames)
    task = asyncio.ensure_future(route)
    await asyncio.sleep(0.05)
    # The writer answered nothing yet: the route read no more than the queue, the batch being answered and
    # the one waiting for room (back-pressure), however far ahead the client is.
    assert len(pipeline.pending) <= IN_FLIGHT + 2 and ws.read <= IN_FLIGHT + 3
    done, deadline = 0, asyncio.get_running_loop().time() + 60
    while done < len(frames):
        assert not task.done(), task.result()  # the route must keep reading while answers come
        assert asyncio.get_running_loop().time() < deadline, f"only {done} of {len(frames)} batches read"
        for future in pipeline.pending[done:]:
            future.set_result({"stored": 1})
        done = len(pipeline.pending)
        await asyncio.sleep(0.01)
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert ws.sent[0]["type"] == "welcome"
    return [reply["seq"] for reply in ws.sent[1:] if reply["type"] == "ack"]


def test_the_connection_ends_when_the_answers_stop_while_reading_waits():
    sent, read, pending = run_async(_answers_stop_scenario())
    assert sent[-1]["type"] == "error" and "could not store" in sent[-1]["message"]
    assert read == pending + 1  # nothing more read after the answering side ended (+1: the hello)


async def _answers_stop_scenario():
    import asyncio

    frames = [protocol.dumps({"type": "batch", "seq": seq}) for seq in range(1, 61)]
    ws, pipeline, route = _stub_route(frames)
    task = asyncio.ensure_future(route)
    deadline = asyncio.get_running_loop().time() + 60
    while not pipeline.pending:  # a loaded machine may take a while to read the first batch
        assert asyncio.get_running_loop().time() < deadline and not task.done()
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the reading side waits for room in the reply queue
    pipeline.pending[0].set_exception(OSError("disk full"))  # the answering side refuses and ends
    await asyncio.wait_for(task, 5)  # ... and so does the connection, without waiting for the client
    return ws.sent, ws.read, len(pipeline.pending)
