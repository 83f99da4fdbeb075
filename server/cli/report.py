"""``gradwatch report RUN [RUN...] -o report.html``: one self-contained HTML file to send to a person.

Charts of every metric (runs overlaid, min/max envelopes that keep every spike), each run's
alerts and the config keys that differ; Plotly.js is inlined from the installed plotly package,
and the pages' own modules (/contract.js and frontend/lib/: the float codec, escaping, run colours,
the envelope) are inlined too, so the file opens anywhere, offline, with nothing fetched, and reads values
exactly as the dashboard does.
"""

from __future__ import annotations

import html
import json
import re
import sys
import time
from pathlib import Path

from gradwatch.contract import keys as vocab
from gradwatch.contract import rules
from gradwatch_server.cli.export import add_source_arguments
from gradwatch_server.cli.source import Progress, open_source, resolve

MAX_POINTS = 2000
# The lib modules the report's script uses, in dependency order; each one's imports (of /contract.js
# and of each other) are dropped, since in the report everything they import is inlined above them.
LIB_MODULES = ("contract.js", "format.js", "plot.js", "series.js", "dom.js", "charts.js")
IMPORT = re.compile(r'^(?:import|export) \{[^}]*\} from "[^"]+";\n', re.M)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write one self-contained HTML report of one or more runs",
        description="Charts of every metric (runs overlaid), the alerts and the config diff, in one "
        "HTML file with Plotly.js inlined: it opens offline and can be mailed.",
    )
    p.add_argument("runs", nargs="+", help="run ids, or names that each match one run")
    p.add_argument("-o", "--output", default="report.html", help="file to write [report.html]")
    add_source_arguments(p)


REPORT_GRADS = (vocab.GLOBAL_NORM, vocab.MISSING_COUNT)  # the gradient keys the report charts


def chart_keys(keys_per_run: list[list[str]]) -> list[str]:
    """Every logged key of any run in the run page's order (training, the script's own, the hook's own);
    per-layer slots (grad/<layer>, act_rms/<module>...) left out, the global norm kept."""
    per_layer = tuple(v + "/" for v in vocab.VECTORS)
    seen: list[str] = []
    for keys in keys_per_run:
        for k in keys:
            if k in seen or k.startswith(per_layer) and k not in REPORT_GRADS:
                continue
            seen.append(k)
    return sorted(seen, key=lambda k: (_section(k), k != "loss", not vocab.is_loss_key(k), k))


def _section(key: str) -> int:
    """0 training (losses, the gradient norm, learning rates), 1 the script's own, 2 the hook's own."""
    if vocab.is_loss_key(key) or vocab.is_lr_key(key) or key in REPORT_GRADS[:1]:
        return 0
    return 2 if vocab.is_system_key(key) else 1


def gather(source, run_ids: list[int]) -> dict:
    """Runs, alerts, config diff and envelopes of every chart key, for the page."""
    from gradwatch_server.storage.edits import config_diff

    runs = [source.run(i) for i in run_ids]
    keys = chart_keys([source.keys(i) for i in run_ids])
    progress = Progress("report: series", len(keys) * len(run_ids))
    series: dict = {}
    for key in keys:
        for run in runs:
            try:
                s = source.series(run["id"], key, MAX_POINTS)
                series.setdefault(key, {})[str(run["id"])] = {"steps": s["steps"], "values": s["values"]}
            except Exception:  # this run never logged the key
                pass
            progress.step()
    alerts = {str(i): source.alerts(i) for i in run_ids}
    return {
        "incidents": {str(i): _incidents(source, i) for i in run_ids},
        "runs": runs,
        "keys": keys,
        "series": series,
        "alerts": alerts,
        "diff": config_diff(runs),
        "created": time.strftime("%Y-%m-%d %H:%M"),
    }


def _incidents(source, run_id: int) -> list[dict]:
    """A run's incidents (story and cause); none from a server that predates them."""
    try:
        return source.incidents(run_id)
    except Exception:  # an older server: the alert table still has everything
        return []


def page_modules() -> str:
    """/contract.js and the pages' lib modules the report uses, as one inline module (the report fetches nothing)."""
    from gradwatch import contract
    from gradwatch_server.web.routes.pages import frontend_dir

    lib = frontend_dir() / "lib"
    bundle = "".join(IMPORT.sub("", (lib / name).read_text(encoding="utf-8")) for name in LIB_MODULES)
    if re.search(r"^(?:import|export) .* from ", bundle, re.M):  # an inline module that imports would fetch
        raise RuntimeError("a lib module imports something the report does not inline")
    return contract.es_module() + bundle


def _script_json(data) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(data, allow_nan=False).replace("</", "<\\/").replace("<!--", "<\\!--")


def _table(header: list[str], rows: list[list[str]], marks: list[bool] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        ("<tr class=differs>" if marks and marks[i] else "<tr>")
        + "".join(f"<td>{html.escape(c)}</td>" for c in row)
        + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value) -> str:
    return "—" if value is None else (value if isinstance(value, str) else json.dumps(value))


def render(data: dict, plotly_js: str) -> str:
    """The whole report as one HTML string."""
    runs = data["runs"]
    summary = _table(
        ["id", "name", "project", "status", "last step", "alerts"],
        [
            [str(r["id"]), r["name"], r["project"], r["status"], _cell(r["last_step"]), str(r["alert_count"])]
            for r in runs
        ],
    )
    alert_rows = [
        [
            str(a["run_id"]),
            rules.title(a["kind"]),
            a["severity"],
            _cell(a["step"]),
            _cell(a.get("layer")),
            str(a.get("count", 1)),
            a["message"],
        ]
        for rid in data["alerts"]
        for a in data["alerts"][rid]
    ]
    alerts = (
        _table(["run", "kind", "severity", "step", "layer", "count", "message"], alert_rows)
        if alert_rows
        else "<p class=muted>No alerts.</p>"
    )
    diff_rows = data["diff"]["rows"]
    diff = (
        _table(
            ["config key"] + [f"{r['name']} (#{r['id']})" for r in runs],
            [[row["key"]] + [_cell(v) for v in row["values"]] for row in diff_rows],
            [row["differs"] for row in diff_rows],
        )
        if diff_rows
        else "<p class=muted>No config.</p>"
    )
    stories = _stories(runs, data.get("incidents", {}))
    charts = "".join(
        f'<div class=card><h3>{html.escape(k)}</h3><div class=chart data-key="{html.escape(k)}"></div></div>'
        for k in data["keys"]
    )
    title = "gradwatch report: " + ", ".join(r["name"] for r in runs)
    names = {str(r["id"]): f"{r['name']} (#{r['id']})" for r in runs}
    return TEMPLATE.format(
        title=html.escape(title),
        created=html.escape(data["created"]),
        summary=summary,
        charts=charts,
        alerts=alerts,
        stories=stories,
        diff=diff,
        config_title=_config_title(len(runs), len(data["diff"]["differs"])),
        plotly=plotly_js.replace("</script", "<\\/script"),
        modules=page_modules().replace("</script", "<\\/script"),
        data=_script_json({"series": data["series"], "keys": data["keys"], "names": names}),
    )


def _config_title(runs: int, differs: int) -> str:
    """The config section's heading, in words that fit the count."""
    if runs < 2:
        return "Config"
    if differs == 0:
        return "Config (the same in every run)"
    return f"Config ({differs} key{'s' if differs > 1 else ''} differ{'s' if differs == 1 else ''}, highlighted)"


def _stories(runs: list[dict], incidents: dict) -> str:
    """Each run's incidents as the run page tells them: what happened, where, why, then the story."""
    names = {str(r["id"]): f"{r['name']} (#{r['id']})" for r in runs}
    items = []
    rank = {"critical": 0, "warning": 1}
    for rid, found in incidents.items():
        # critical first, then in order of their first step (as the run page ranks them)
        for inc in sorted(found, key=lambda i: (rank.get(i.get("severity"), 2), i.get("first_step") or 0)):
            root = inc.get("root") or {}
            alerts = sorted(inc.get("alerts") or [root], key=lambda a: (a.get("step") is None, a.get("step") or 0))
            what = next((a for a in alerts if a.get("severity") == "critical"), root)
            where = f" at step {what['step']}" if what.get("step") is not None else ""
            cause = f"<div>Cause: {html.escape(inc['cause'])}</div>" if inc.get("cause") else ""
            story = f"<div class=muted>{html.escape(_kinds_as_words(inc.get('story') or ''))}</div>"
            items.append(
                f"<li class='incident {html.escape(inc.get('severity') or '')}'><b>{html.escape(names.get(rid, rid))}: "
                f"{html.escape(rules.title(what.get('kind', '')))}{where}</b> "
                f"<span class=muted>({html.escape(inc.get('severity') or '')}, {html.escape(inc.get('status') or '')})</span>"
                f"{cause}{story}</li>"
            )
    return f"<ul class=incidents>{''.join(items)}</ul>" if items else "<p class=muted>No incidents.</p>"


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _kinds_as_words(text: str) -> str:
    """Alert kinds inside a server sentence ("throughput_drop at 740") as words."""
    kinds = set(rules.alert_kinds())
    return re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda m: _lower_first(rules.title(m[0])) if m[0] in kinds else m[0], text)


def run_report(args) -> int:
    from gradwatch_server.web.routes.pages import plotly_js

    source = open_source(args)
    try:
        ids = [resolve(source, ref) for ref in args.runs]
        data = gather(source, ids)
    finally:
        source.close()
    Path(args.output).write_text(render(data, plotly_js().read_text(encoding="utf-8")), encoding="utf-8")
    print(
        f"gradwatch: report of {len(ids)} run(s), {len(data['keys'])} charts, written to {args.output}", file=sys.stderr
    )
    return 0


TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 24px; color: #1d2330; }}
h1 {{ font-size: 20px; }} h2 {{ font-size: 16px; margin-top: 28px; }} h3 {{ font-size: 13px; margin: 4px 0; }}
table {{ border-collapse: collapse; margin: 8px 0; }} td, th {{ border: 1px solid #e4e7ec; padding: 3px 8px; text-align: left; vertical-align: top; }}
tr.differs td {{ background: #fff4d6; font-weight: 600; }} .muted {{ color: #5f6b7a; }}
.grid {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(480px, 1fr)); gap: 12px; }}
.card {{ border: 1px solid #e4e7ec; border-radius: 6px; padding: 8px; }} .chart {{ height: 300px; }}
ul.incidents {{ padding: 0; list-style: none; }} ul.incidents li {{ border-left: 4px solid #b54708; padding: 4px 10px; margin: 6px 0; }}
ul.incidents li.critical {{ border-left-color: #d92d20; }}
</style></head><body>
<h1>{title}</h1><p class=muted>Made by gradwatch on {created}. Charts keep every spike (min/max envelopes); NaN/inf points are red crosses; a y axis is logarithmic where the values span more than 3 decades, as on the run page.</p>
<h2>Runs</h2>{summary}
<h2>What happened</h2>{stories}
<h2>Charts</h2><div class=grid id=charts>{charts}</div>
<h2>Alerts</h2>{alerts}
<h2>{config_title}</h2>{diff}
<script>{plotly}</script>
<script type="application/json" id="report-data">{data}</script>
<script type="module">
{modules}
// The report itself: num (the float codec), esc, colorFor and yAxis (the run page's axis choice) come
// from the modules above.
{{
  const D = JSON.parse(document.getElementById("report-data").textContent);
  const several = Object.keys(D.names).length > 1; // several runs: log only when it helps each (compare's rule)
  // Plotly reads a subset of HTML in trace names: a run named "<b>x</b>" must show as text (esc).
  for (const div of document.querySelectorAll(".chart")) {{
    const key = div.dataset.key, traces = [], shown = [], bad = {{ x: [], y: [], type: "scatter", mode: "markers", name: "NaN / inf",
      yaxis: "y2", marker: {{ symbol: "x", size: 10, color: "#d92d20" }} }};
    for (const [id, s] of Object.entries(D.series[key] || {{}})) {{
      const values = s.values.map(num);
      shown.push({{ values }});
      traces.push({{ x: s.steps, y: values.map((v) => (v !== null && isFinite(v) ? v : null)), type: "scatter", mode: "lines",
        name: esc(D.names[id]), line: {{ color: colorFor(id), width: 1.6 }} }});
      values.forEach((v, i) => {{ if (v !== null && !isFinite(v)) {{ bad.x.push(s.steps[i]); bad.y.push(v === -Infinity ? 0.03 : 0.97); }} }});
    }}
    if (bad.x.length) traces.push(bad);
    const y = yAxis(shown, null, false, several);
    // The legend above the plot: below it, it covered the x axis' title.
    Plotly.newPlot(div, traces, {{ margin: {{ l: 56, r: 10, t: 34, b: 40 }}, showlegend: true,
      legend: {{ orientation: "h", x: 0, y: 1.02, xanchor: "left", yanchor: "bottom" }},
      xaxis: {{ title: {{ text: "step" }} }}, yaxis: y.axis,
      yaxis2: {{ overlaying: "y", range: [0, 1], visible: false, fixedrange: true }} }}, {{ displaylogo: false, responsive: true }});
    div.dataset.ylog = y.log ? "1" : "0";
  }}
}}
</script></body></html>
"""
