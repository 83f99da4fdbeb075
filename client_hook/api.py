"""Reading runs back in Python: ``gradwatch.Api().runs(where=...)`` and ``run.history()`` as a pandas DataFrame.

Over the server's HTTP API with the standard library only (pandas is needed for ``history`` alone:
``pip install gradwatch[pandas]``). Non-finite values come back exact: the API's "NaN"/"Infinity"
strings are decoded through the contract's codec.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

from gradwatch import contract, protocol


class ApiError(RuntimeError):
    """The server refused a request (a bad ``where``, an unknown run) or could not be reached: one line.

    ``reason`` is the server's one-line reason (or why it could not be reached), ``status`` the HTTP status (None
    when the server was not reached).
    """

    def __init__(self, message: str, reason: str = "", status: int | None = None):
        super().__init__(message)
        self.reason, self.status = reason or message, status


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects followed, but the token only to the same scheme, host and port (never https -> http, never
    another host: a redirect must not hand the server's token to whoever it names)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and not _same_origin(req.full_url, new.full_url):
            new.remove_header("Authorization")
        return new


def _same_origin(old: str, new: str) -> bool:
    a, b = urllib.parse.urlsplit(old), urllib.parse.urlsplit(new)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)


_OPENER = urllib.request.build_opener(_Redirects)


def call(server: str, token: str | None, method: str, path: str, timeout: float = 60.0, **query):
    """One JSON API call with the token (query values None are left out); ApiError says why it failed."""
    query = {k: v for k, v in query.items() if v is not None}
    url = server + path + ("?" + urllib.parse.urlencode(query) if query else "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with _OPENER.open(urllib.request.Request(url, method=method, headers=headers), timeout=timeout) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as err:
        try:
            why = json.loads(err.read()).get("error")
        except Exception:  # not a JSON error body: the status line says it
            why = err.reason
        raise ApiError(f"{server}{path}: {why} (HTTP {err.code})", str(why), err.code) from None
    except (urllib.error.URLError, OSError) as exc:
        why = str(getattr(exc, "reason", exc))
        raise ApiError(f"cannot reach the gradwatch server at {server}: {why}", why) from None


class Api:
    """A gradwatch server's runs, read over HTTP.

    Args:
        server: the server's URL; default ``$GRADWATCH_SERVER`` or http://127.0.0.1:8765.
        token: the server's access token; default ``$GRADWATCH_TOKEN`` (none for a local server).
    """

    def __init__(self, server: str | None = None, token: str | None = None, timeout: float = 60.0):
        self.server = (server or os.environ.get("GRADWATCH_SERVER") or protocol.DEFAULT_SERVER).rstrip("/")
        self.token = token or os.environ.get("GRADWATCH_TOKEN") or None
        self.timeout = timeout

    def get(self, path: str, **query):
        """GET a JSON API path (query values None are left out); raises ApiError with the server's reason."""
        return call(self.server, self.token, "GET", path, self.timeout, **query)

    def runs(
        self,
        project: str | None = None,
        where: str | None = None,
        order_by: str | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs matching a filter, in order.

        Args:
            project: only this project's runs.
            where: the runs language, e.g. ``'config.lr < 1e-3 and summary.val/loss.min < 0.5'``.
            order_by: e.g. ``'-summary.val/acc.max'`` (a leading '-' sorts descending); default newest first.
            limit: at most this many runs.

        Returns:
            ``RunRecord`` objects with ``.id .name .project .status .config .summary`` and ``.history()``.
        """
        rows = self.get("/api/runs", project=project, where=where, order_by=order_by, limit=limit, columns="summary.*")
        return [RunRecord(self, row) for row in rows]

    def run(self, run_id: int) -> RunRecord:
        """One run by id (with its summaries)."""
        rows = self.get("/api/runs", where=f"id == {int(run_id)}", columns="summary.*")
        if not rows:
            raise ApiError(f"{self.server}: run {run_id} not found")
        return RunRecord(self, rows[0])


def _decode_summary(summary: dict) -> dict:
    out = {}
    for key, figures in (summary or {}).items():
        out[key] = {
            name: contract.decode_float(v) if isinstance(v, (str, float)) and name not in ("count", "nans") else v
            for name, v in figures.items()
        }
    return out


class RunRecord:
    """One run as the API lists it: ``.id .name .project .status .config .summary`` (key → last/min/max/…)."""

    def __init__(self, api: Api, row: dict):
        self.api = api
        self.row = row
        self.id: int = row["id"]
        self.name: str = row["name"]
        self.project: str = row["project"]
        self.status: str = row["status"]
        self.config: dict = row.get("config") or {}
        self.summary: dict = _decode_summary(row.get("summary"))
        self.tags: list = row.get("tags") or []
        self.run_summary: dict = row.get("run_summary") or {}  # what the script set in run.summary (W&B's)
        self.group, self.job_type = row.get("group"), row.get("job_type")

    def __repr__(self) -> str:
        return f"<RunRecord {self.id} {self.project}/{self.name} {self.status}>"

    def keys(self) -> list[str]:
        """Every metric key of the run (per-layer keys as ``grad/<parameter>``)."""
        return self.api.get(f"/api/runs/{self.id}/keys")

    def history(self, keys: list[str] | None = None):
        """Every point of some keys (default: every scalar key with a summary) as a pandas DataFrame.

        Returns:
            A DataFrame indexed by step, one float64 column per key; NaN and ±inf exactly as logged,
            and NaN where a key has no value at a step.
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "RunRecord.history() needs pandas: pip install 'gradwatch[pandas]' (or pip install pandas)"
            ) from None
        keys = list(self.summary) if keys is None else list(keys)
        columns = {}
        for key in keys:
            s = self.api.get(f"/api/runs/{self.id}/series", key=key)
            values = [contract.decode_float(v) for v in s["values"]]
            series = pd.Series([float("nan") if v is None else v for v in values], index=s["steps"], dtype="float64")
            columns[key] = series[~series.index.duplicated(keep="last")]  # a repeated step: the last value
        frame = pd.DataFrame(columns, columns=keys)
        frame.index.name = "step"
        frame = frame.sort_index()
        frame.attrs["summary"] = {**{k: v.get("last") for k, v in self.summary.items()}, **self.run_summary}
        frame.attrs["figures"] = self.summary  # key -> last/min/max/count/... as the server keeps them
        return frame

    # -- what a run logged beyond numbers (docs/wandb.md) -----------------------------------
    def media(self) -> list[dict]:
        """Every histogram, image, table and text key: ``[{"key", "kind", "steps", "first_step", "last_step"}]``."""
        return self.api.get(f"/api/runs/{self.id}/media")

    def histograms(self, key: str, max_steps: int = 400) -> list[dict]:
        """A histogram key over steps: ``[{"step", "lo", "hi" (or "edges"), "counts", "nan", "inf", "ninf"}]``."""
        return self.api.get(f"/api/runs/{self.id}/histograms", key=key, max_steps=max_steps)["histograms"]

    def images(self, key: str, step: int | None = None) -> list[dict]:
        """The images of a key at ``step`` (default the last), each with its ``png`` bytes, ``width``, ``height``, ``caption``."""
        found = self.api.get(f"/api/runs/{self.id}/images", key=key, step=step)
        return [{**image, "step": found["step"], "png": self.image_png(image["id"])} for image in found["images"]]

    def image_png(self, image_id: int) -> bytes:
        """One image's PNG bytes."""
        url = f"{self.api.server}/api/runs/{self.id}/images/{int(image_id)}.png"
        headers = {"Authorization": f"Bearer {self.api.token}"} if self.api.token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=self.api.timeout) as r:
                return r.read()
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(f"{url}: {getattr(exc, 'reason', exc)}") from None

    def table(self, key: str, step: int | None = None) -> dict:
        """A table (``columns``, ``rows``; non-finite cells decoded) or a text (``text``) at ``step`` (default the last)."""
        found = self.api.get(f"/api/runs/{self.id}/tables", key=key, step=step)
        if "rows" in found:
            found["rows"] = [
                [contract.decode_float(c) if c in ("NaN", "Infinity", "-Infinity") else c for c in r]
                for r in found["rows"]
            ]
        return found
