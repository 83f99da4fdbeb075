"""``gradwatch.Api``: runs back from a real server into Python and pandas, NaN and ±inf exact; docs/api.md's example runs."""

from __future__ import annotations

import contextlib
import io
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import gradwatch
from gradwatch.api import ApiError

DOC = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()


def _sweep(url: str) -> None:
    for i, (lr, opt) in enumerate([(1e-4, "adam"), (1e-3, "adam"), (1e-2, "sgd"), (3e-3, "adam")]):
        run = gradwatch.init(project="sweep", name=f"r{i}", server=url, config={"lr": lr, "optimizer": opt})
        for step in range(0, 50, 2 if i == 3 else 1):
            record = {"loss": 2.0 / (step + 1) + lr, "val/loss": 1.0 / (step + 1) + lr * 10}
            if i == 0 and step == 7:
                record["loss"] = math.nan
            if i == 0 and step == 8:
                record["loss"] = -math.inf
            if step % 10 == 0:
                record["val/acc"] = step / 50
            run.log(record, step=step)
        run.finish(timeout=30)


def test_runs_and_history_into_pandas(server):
    _sweep(server.url)
    api = gradwatch.Api(server.url)
    best = api.runs(project="sweep", where='config.optimizer == "adam"', order_by="summary.val/loss.min")
    assert [r.name for r in best] == ["r0", "r1", "r3"]
    r0 = best[0]
    assert (r0.id, r0.project, r0.status, r0.config) == (1, "sweep", "finished", {"lr": 1e-4, "optimizer": "adam"})
    assert r0.summary["loss"]["min"] == -math.inf and r0.summary["loss"]["nans"] == 1
    assert r0.summary["val/loss"]["min"] == pytest.approx(1 / 50 + 1e-3) and r0.summary["val/loss"]["min_step"] == 49
    frame = r0.history()
    assert frame.index.name == "step" and list(frame.index) == list(range(50))
    assert set(frame.columns) == {"loss", "val/loss", "val/acc"} and all(frame.dtypes == "float64")
    assert math.isnan(frame.loc[7, "loss"]) and frame.loc[8, "loss"] == -math.inf
    assert frame.loc[3, "loss"] == 2.0 / 4 + 1e-4  # exact, not rounded through text
    assert frame["val/acc"].notna().sum() == 5 and math.isnan(frame.loc[3, "val/acc"])  # no value: NaN
    sparse = api.runs(where='name == "r3"')[0].history(["loss"])
    assert list(sparse.index) == list(range(0, 50, 2))
    assert len(api.runs(limit=2)) == 2 and api.run(3).name == "r2"


def test_errors_are_one_line(server):
    api = gradwatch.Api(server.url)
    with pytest.raises(ApiError, match=r"where at column 13: .*\(HTTP 400\)"):
        api.runs(where="config.lr < ")
    with pytest.raises(ApiError, match="cannot reach"):
        gradwatch.Api("http://127.0.0.1:9").runs()


def test_the_docs_example_runs(server):
    _sweep(server.url)
    section = DOC.split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1).replace("http://127.0.0.1:8765", server.url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/api.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("1 r0 finished 0.0001 ") and len(lines) >= 4
    assert lines[3].split()[0] == "49"  # the step of the best val/loss


def test_without_pandas_history_says_how_to_get_it(server):
    _sweep(server.url)
    code = (
        "import sys; sys.modules['pandas'] = None\n"
        "import gradwatch\n"
        f"r = gradwatch.Api({server.url!r}).runs(limit=1)[0]\n"
        "try:\n    r.history()\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'gradwatch[pandas]'" in out.stdout, out.stderr
    assert isinstance(pd.DataFrame(), pd.DataFrame)


def test_the_token_never_follows_a_redirect_to_another_host(server):
    """A server (or a proxy) that redirects elsewhere does not get the token sent there; the same origin does."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: dict[str, str | None] = {}

    def serve(handler):
        http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=http.serve_forever, daemon=True).start()
        return http, f"http://127.0.0.1:{http.server_address[1]}"

    class Other(BaseHTTPRequestHandler):  # another host: records what it was sent
        def do_GET(self):  # noqa: N802
            seen[self.path] = self.headers.get("Authorization")
            if self.path.startswith("/again"):
                self.send_response(302)
                self.send_header("Location", "/api/runs")
                self.end_headers()
                return
            body = json.dumps([]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other, other_url = serve(Other)

    class Redirector(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(307)
            self.send_header("Location", other_url + "/api/runs")
            self.end_headers()

        def log_message(self, *args):
            pass

    redirector, redirector_url = serve(Redirector)
    try:
        assert gradwatch.Api(redirector_url, token="tok-secret").runs() == []
        assert seen["/api/runs"] is None  # dropped on the way to another host
        seen.clear()
        gradwatch.Api(other_url, token="tok-secret").get("/again")
        assert seen["/again"] == seen["/api/runs"] == "Bearer tok-secret"  # same origin: kept
    finally:
        other.shutdown()
        redirector.shutdown()
