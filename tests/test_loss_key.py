"""The run's loss key: gradwatch.contract.main_loss_key and its JavaScript twin agree (under node)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from gradwatch import contract

NODE = shutil.which("node")
CASES = [
    (["loss", "train_loss"], None),
    (["train_loss", "val_loss"], None),
    (["val_loss", "acc"], None),  # a validation loss alone is not the run's loss
    (["nll", "loss"], "nll"),  # the declared key wins
    (["loss"], "nll"),  # declared but never logged: the usual names
    (["train/loss", "loss/train"], None),
    ([], None),
]


def test_the_declared_key_then_the_usual_names():
    assert [contract.main_loss_key(keys, declared) for keys, declared in CASES] == [
        "loss",
        "train_loss",
        None,
        "nll",
        "loss",
        "train/loss",
        None,
    ]
    assert contract.shared_constants()["LOSS_KEYS"] == list(contract.LOSS_KEYS)


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_pages_twin_agrees(tmp_path):
    (tmp_path / "m.mjs").write_text(contract.es_module(), encoding="utf-8")
    script = f'import * as M from "./m.mjs";\nconst cases = {json.dumps(CASES)};\n'
    script += "console.log(JSON.stringify(cases.map(([k, d]) => M.mainLossKey(k, d))));\n"
    (tmp_path / "run.mjs").write_text(script, encoding="utf-8")
    out = subprocess.run([NODE, str(tmp_path / "run.mjs")], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == [contract.main_loss_key(k, d) for k, d in CASES]
