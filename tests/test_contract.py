"""One contract: gradwatch.contract owns the shared facts; /contract.js serves them to the pages.

The JavaScript twins (loss keys, float codec, the page's envelope fold) run under node against the
Python on the same inputs, and the frontend keeps no hand copy of what the contract owns.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gradwatch import contract, protocol
from gradwatch_server.cli.report import page_modules
from gradwatch_server.serve import BackgroundServer
from gradwatch_server.storage.downsample import envelope

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


def node(tmp_path: Path, module: str, script: str):
    """Runs ``script`` (which sees the module's exports as M) under node; returns what it prints as JSON."""
    (tmp_path / "m.mjs").write_text(module, encoding="utf-8")
    (tmp_path / "run.mjs").write_text('import * as M from "./m.mjs";\n' + script, encoding="utf-8")
    out = subprocess.run([NODE, str(tmp_path / "run.mjs")], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def get(url: str, headers: dict | None = None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, "", ""


def test_protocol_names_are_the_contract_ones():
    assert protocol.encode_float is contract.encode_float and protocol.decode_float is contract.decode_float
    assert protocol.is_loss_key is contract.is_loss_key and protocol.ProtocolError is contract.ProtocolError
    assert protocol.MAX_STEP == contract.MAX_STEP
    assert set(contract.ENDED_STATUSES) | set(contract.ACTIVE_STATUSES) == set(contract.STATUSES)
    assert set(contract.CLIENT_STATUSES) <= set(contract.STATUSES)
    for kind in ("lr_suggestion", "data_gap", "data_refused", "stalled", "memory_pressure", "missing_gradients"):
        assert kind in contract.ALERT_KINDS
    assert len(set(contract.ALERT_KINDS)) == len(contract.ALERT_KINDS)


def test_served_contract_js_is_the_generated_module(server):
    status, ctype, body = get(server.url + "/contract.js")
    assert status == 200 and "javascript" in ctype
    assert body == contract.es_module()
    for word in (*contract.STATUSES, *contract.ALERT_KINDS, *contract.SEVERITIES):
        assert json.dumps(word) in body, word


def test_contract_js_is_behind_the_token(settings):
    srv = BackgroundServer(dataclasses.replace(settings, token="s3cret-token")).start()
    try:
        assert get(srv.url + "/contract.js")[0] == 401
        assert get(srv.url + "/contract.js", {"Authorization": "Bearer s3cret-token"})[0] == 200
    finally:
        srv.stop()


LOSS_KEYS = ["loss", "val/loss", "train_loss", "lossy", "Loss", "a/b/VAL_LOSS", "loss/val", "val/acc", "lr", "x/"]


@needs_node
def test_js_codec_and_loss_rule_agree_with_python(tmp_path):
    encoded = ["NaN", "Infinity", "-Infinity", 1.5, 0, -2.25, 1e308, 5e-324, None]
    out = node(
        tmp_path,
        contract.es_module(),
        f"""
const keys = {json.dumps(LOSS_KEYS)}, encoded = {json.dumps(encoded)};
const floats = [NaN, Infinity, -Infinity, 1.5, 0, -2.25, 1e308, 5e-324, null];
console.log(JSON.stringify({{
  loss: keys.map(M.isLossKey),
  decoded: encoded.map((v) => M.encodeFloat(M.decodeFloat(v))),
  nonfinite: encoded.slice(0, 3).map((v) => String(M.decodeFloat(v))),
  encoded: floats.map(M.encodeFloat),
  constants: {{ STATUSES: M.STATUSES, ALERT_KINDS: M.ALERT_KINDS, MAX_KEY_LEN: M.MAX_KEY_LEN }},
}}));
""",
    )
    assert out["loss"] == [contract.is_loss_key(k) for k in LOSS_KEYS]
    assert out["loss"][:6] == [True] * 6 and out["loss"][6:] == [False] * 4
    assert out["decoded"] == [contract.encode_float(contract.decode_float(v)) for v in encoded]
    assert out["nonfinite"] == ["NaN", "Infinity", "-Infinity"]
    floats = [math.nan, math.inf, -math.inf, 1.5, 0.0, -2.25, 1e308, 5e-324, None]
    assert out["encoded"] == [contract.encode_float(v) for v in floats]
    assert out["constants"] == {k: contract.shared_constants()[k] for k in out["constants"]}


KEY_CASES = [
    "lr",
    "lr/0",
    "lrx",
    "grad/global_norm",
    "grad/missing_count",
    "grad/fc.weight",
    "memory/rss",
    "system/gpu0/util",
]
KEY_CASES += ["signals/act_rms_max", "perf/step_time", "amp/scale", "loss", "val/acc", "gradient", "x/grad/y"]
COLUMNS = "name, config.opt.lr,summary.loss.min , summary.loss.at_min(lr),summary.acc.at_max(a,b),,summary.loss"


@needs_node
def test_js_key_helpers_and_column_grammar_agree_with_python(tmp_path):
    from gradwatch.contract import keys, options

    out = node(
        tmp_path,
        contract.es_module(),
        f"""
const keys = {json.dumps(KEY_CASES)}, cols = {json.dumps(COLUMNS)};
console.log(JSON.stringify({{
  lr: keys.map(M.isLrKey), layer: keys.map(M.isLayerKey), family: keys.map(M.family),
  system: keys.map(M.isSystemKey), main: M.mainLossKey(["x", "train_loss", "loss/train"], "nope"),
  split: M.splitColumns(cols), parsed: M.splitColumns(cols).map(M.parseColumn), none: M.splitColumns(null),
  KEYS: M.KEYS, FAMILIES: M.FAMILIES,
}}));
""",
    )
    assert out["lr"] == [keys.is_lr_key(k) for k in KEY_CASES] and out["lr"][:3] == [True, True, False]
    assert out["layer"] == [keys.is_layer_key(k) for k in KEY_CASES] and sum(out["layer"]) == 1
    assert out["family"] == [keys.family(k) for k in KEY_CASES] and out["family"][-3:] == [None] * 3
    assert out["system"] == [keys.is_system_key(k) for k in KEY_CASES]
    assert out["main"] == keys.main_loss_key(["x", "train_loss", "loss/train"], "nope") == "train_loss"
    assert out["split"] == options.column_names(COLUMNS) and "summary.acc.at_max(a,b)" in out["split"]
    assert [tuple(p) for p in out["parsed"]] == [options.parse_column(c) for c in options.column_names(COLUMNS)]
    assert out["parsed"][3] == ["summary", "loss", "at_min(lr)"] and out["none"] == []
    assert out["KEYS"] == keys.KEYS and out["FAMILIES"] == keys.FAMILIES


def test_every_key_the_client_writes_is_in_the_vocabulary():
    """A scan of the client: each key literal it spells is a vocabulary key, and each ``keys.NAME`` it reads exists."""
    import ast

    from gradwatch.contract import keys

    prefixes, spelled = tuple(keys.FAMILIES.values()), set(keys.KEYS.values())
    patterns = (keys.gpu_key(0, ""), keys.LR_PREFIX, keys.GRAD_PREFIX)  # families whose keys are built at run time
    unknown, names = [], set()
    for path in (ROOT / "client_hook").rglob("*.py"):
        if "contract" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "keys":
                names.add(node.attr)
            if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
                text, built = node.values[0].value, True
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text, built = node.value, False
            else:
                continue
            if text.startswith(prefixes) and not (text in spelled or (built and text.startswith(patterns))):
                if not any(p.startswith(text) for p in patterns):
                    unknown.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text!r}")
    assert unknown == [], "a key the client writes is missing from gradwatch/contract/keys.py"
    assert [n for n in names if not hasattr(keys, n)] == []


def test_no_option_list_retyped_in_the_pages_or_the_server():
    from gradwatch.contract import options

    pages = "".join(p.read_text() for p in (ROOT / "frontend").rglob("*.js") if p.name != "channels.js")
    server = "".join(p.read_text() for p in (ROOT / "server").rglob("*.py"))
    for values in (options.SEVERITIES, options.CUSTOM_RULE_TYPES, options.AGGREGATIONS, options.BANDS):
        listed = json.dumps(list(values))[1:-1]  # '"info", "warning", "critical"', as both languages format it
        assert listed not in pages and listed not in server and "|".join(values) not in server, values
    assert pages.count("[^,()]+") == 0 and server.count("[^,()]+") == 0  # the column split is the contract's


def _series(rng: random.Random, n: int) -> tuple[list[int], list]:
    steps, step = [], 0
    for _ in range(n):
        step += rng.choice((1, 1, 1, 2, 7))  # uneven steps: buckets of different fill
        steps.append(step)
    values = [round(rng.gauss(0, 1), rng.choice((1, 6))) for _ in range(n)]  # rounding makes ties
    for i in rng.sample(range(n), 12):
        values[i] = rng.choice([math.nan, math.inf, -math.inf, 1e9, -1e9])
    return steps, values


@needs_node
def test_page_envelope_keeps_the_same_points_as_the_server(tmp_path):
    rng = random.Random(7)
    cases = [(*_series(rng, n), budget) for n, budget in ((5000, 400), (9000, 4000), (1200, 50), (300, 400), (64, 7))]
    wire = [
        {"steps": st, "values": [contract.encode_float(v) for v in vals], "max": budget} for st, vals, budget in cases
    ]
    (tmp_path / "cases.json").write_text(json.dumps(wire))
    kept = node(
        tmp_path,
        page_modules(),  # contract + the lib modules, exactly as the report inlines them
        """
import { readFileSync } from "node:fs";
const cases = JSON.parse(readFileSync(new URL("./cases.json", import.meta.url)));
console.log(JSON.stringify(cases.map((c) => {
  const s = { steps: c.steps, values: c.values.map(M.num), walls: c.steps };
  return M.compact(s, c.max).steps;
})));
""",
    )
    for (steps, values, budget), page_steps in zip(cases, kept):
        assert page_steps == [steps[i] for i in envelope(steps, values, budget).tolist()]


def test_report_inlines_the_modules_without_imports():
    bundle = page_modules()
    assert bundle.startswith(contract.es_module())
    assert not re.search(r"^(?:import|export) .* from ", bundle, re.M)
    assert "export const num" in bundle and "export function compact" in bundle
    report = (ROOT / "server" / "cli" / "report.py").read_text()
    assert '"NaN" ? NaN' not in report and '"-Infinity"' not in report  # no inline codec copy


def test_no_hand_copy_of_the_contract_in_the_frontend():
    frontend = ROOT / "frontend"
    texts = {str(p.relative_to(frontend)): p.read_text() for p in [*frontend.rglob("*.js"), *frontend.glob("*.html")]}
    statuses = "|".join(contract.STATUSES)
    for name, text in texts.items():
        assert not re.search(rf"<option>({statuses})</option>", text), name  # status lists come from STATUSES
        assert not re.search(rf'"({statuses})",\s*"({statuses})"', text), name
        assert 'toLowerCase().includes("loss")' not in text, name  # isLossKey comes from /contract.js
        assert '"-Infinity"' not in text and '"Infinity" ?' not in text, name  # so does the float codec
    assert 'from "/contract.js"' in texts["lib/contract.js"]
    assert 'from "/contract.js"' not in "".join(t for n, t in texts.items() if n != "lib/contract.js")  # one importer
