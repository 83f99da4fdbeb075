"""``gradwatch export RUN --format csv|parquet|json``: every point of a run, NaN/inf exact."""

from __future__ import annotations

import csv
import io
import json
import math
import sys

from gradwatch import protocol
from gradwatch.contract.options import EXPORT_FORMATS
from gradwatch_server.cli.source import Progress, SourceError, decode, open_source, resolve

FORMATS = EXPORT_FORMATS
COLUMNS = ("run_id", "key", "step", "wall_time", "value")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write every point of a run to CSV, Parquet or JSON",
        description="Every point of every key of a run (per-layer gradient norms as grad/<layer>). "
        "CSV and Parquet are long tables (run_id, key, step, wall_time, value); NaN and "
        "inf stay exact (CSV: nan, inf, -inf; an empty value is a missing gradient). JSON "
        "adds the run's config, metadata and alerts.",
    )
    p.add_argument("run", help="run id, or a run name that matches one run")
    p.add_argument("--format", choices=FORMATS, default="csv")
    p.add_argument("-o", "--output", help="file to write ['run<id>.<format>'; '-' for stdout, csv and json only]")
    p.add_argument("--keys", help="comma-separated keys to export [all]")
    add_source_arguments(p)


def add_source_arguments(p) -> None:
    p.add_argument("--server", help="server address [$GRADWATCH_SERVER or http://127.0.0.1:8765]")
    p.add_argument("--token", help="the server's token [$GRADWATCH_TOKEN]")
    p.add_argument(
        "--db", help="read this database directly instead of asking a server (sqlite:///... or postgresql://...)"
    )


def collect(source, run_id: int, keys: list[str] | None = None) -> dict:
    """{"run", "alerts", "summary", "series": {key: {steps, wall_times, values (floats or None)}}} with progress.

    ``summary``: key -> last/min/max/count figures; ``run["run_summary"]``: what the script set in run.summary.
    """
    run = source.run(run_id)
    keys = keys or source.keys(run_id)
    progress = Progress(f"export run {run_id}: keys", len(keys))
    series = {}
    for key in keys:
        s = source.series(run_id, key)
        series[key] = {"steps": s["steps"], "wall_times": s["wall_times"], "values": decode(s["values"])}
        progress.step(note=key)
    listed = source.runs(where=f"id == {int(run_id)}", columns="summary.*")
    summary = listed[0].get("summary", {}) if listed else {}  # last/min/max/count per key; run.summary is in run
    return {"run": run, "alerts": source.alerts(run_id), "summary": summary, "series": series}


def rows(data: dict):
    """(run_id, key, step, wall_time, value) for every point, key by key, in step order."""
    run_id = data["run"]["id"]
    for key, s in data["series"].items():
        for step, wall, value in zip(s["steps"], s["wall_times"], s["values"]):
            yield run_id, key, step, wall, value


def _csv_value(v) -> str:
    if v is None:
        return ""
    return repr(float(v)) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet run a cell as a formula


def csv_text(text: str) -> str:
    """A text cell a spreadsheet shows as text: a leading formula character gets a ' before it (OWASP)."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def to_csv(data: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for run_id, key, step, wall, value in rows(data):
        writer.writerow([run_id, csv_text(key), step, repr(float(wall)), _csv_value(value)])
    return out.getvalue()


def to_json(data: dict) -> str:
    series = {
        k: {**s, "values": [protocol.encode_float(v) if v is not None else None for v in s["values"]]}
        for k, s in data["series"].items()
    }
    body = {"run": data["run"], "alerts": data["alerts"], "summary": data.get("summary", {}), "series": series}
    return json.dumps(body, allow_nan=False, indent=1)


def _need_pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError(
            "--format parquet needs pyarrow, which is not installed: pip install pyarrow (or use --format csv / json)"
        ) from None
    return pa, pq


def write_parquet(data: dict, path: str) -> None:
    pa, pq = _need_pyarrow()
    columns = list(zip(*rows(data))) or [[] for _ in COLUMNS]
    table = pa.table(
        {
            "run_id": pa.array(columns[0], pa.int64()),
            "key": pa.array(columns[1], pa.string()),
            "step": pa.array(columns[2], pa.int64()),
            "wall_time": pa.array(columns[3], pa.float64()),
            "value": pa.array(columns[4], pa.float64()),
        }
    )
    pq.write_table(table, path)


def run_export(args) -> int:
    source = open_source(args)
    try:
        run_id = resolve(source, args.run)
        output = args.output or f"run{run_id}.{args.format}"
        if output == "-" and args.format == "parquet":
            raise SourceError("parquet is binary: give a file with -o")
        if args.format == "parquet":
            _need_pyarrow()  # before reading everything
        data = collect(source, run_id, args.keys.split(",") if args.keys else None)
        points = sum(len(s["steps"]) for s in data["series"].values())
        if args.format == "parquet":
            write_parquet(data, output)
        else:
            text = to_csv(data) if args.format == "csv" else to_json(data)
            if output == "-":
                sys.stdout.write(text)
            else:
                with open(output, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
        if output != "-":
            print(
                f"gradwatch: exported run {run_id} ({len(data['series'])} keys, {points:,} points) to {output}",
                file=sys.stderr,
            )
        return 0
    finally:
        source.close()
