"""karpathy/nanoGPT, unmodified but for the README's two gradwatch lines, on CPU with a tiny config: does the
blow-up you can see get an alert, and does the healthy configuration stay quiet?

Usage: python benchmarks/nanogpt_alert.py [--nanogpt PATH] [--which bad|healthy|both] [--iters N] [--check]
PATH (default $NANOGPT_DIR) is a nanoGPT checkout; nothing of it is copied into this repository. The data is
a char-level dataset built in a temporary directory from this repo's docs (nanoGPT's own prepare scripts
download). A server runs in this process on a temporary SQLite file; train.py runs as its own process with
``import gradwatch`` after the optimizer is made, ``run.watch(model, optimizer)`` and ``run.log({"loss": ...})``
at each printed iteration. Prints one JSON line per configuration: its first alert step and its alerts.
``--check``: exit 1 unless the bad configuration (lr 0.5, warmup 5, no clipping) is alerted by step 8 and the
healthy one (shakespeare_char's lr 1e-3, warmup, clip 1.0) raises nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=2", "--n_head=2", "--n_embd=64"]
TINY += [
    "--block_size=64",
    "--batch_size=12",
    "--gradient_accumulation_steps=1",
    "--eval_iters=2",
    "--log_interval=1",
    "--always_save_checkpoint=False",
]
CONFIGS = {  # name: (train.py overrides, alerted by this step or None: no alert at all)
    "bad": (["--learning_rate=0.5", "--warmup_iters=5", "--grad_clip=0.0", "--dropout=0.0"], 8),
    "healthy": (
        ["--learning_rate=1e-3", "--warmup_iters=20", "--grad_clip=1.0", "--beta2=0.99", "--dropout=0.2"],
        None,
    ),
}
HOOK_INIT = (
    "import gradwatch\n"
    "_gw = gradwatch.init(project='nanogpt', name=os.environ['GW_NAME'], server=os.environ['GW_SERVER'], config=config)\n"
    "_gw.watch(model, optimizer)\n"
)


def char_dataset(where: Path) -> None:
    """train.bin / val.bin / meta.pkl in nanoGPT's shakespeare_char format, from this repo's docs."""
    text = "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    cut = int(0.9 * len(ids))
    where.mkdir(parents=True)
    ids[:cut].tofile(where / "train.bin")
    ids[cut:].tofile(where / "val.bin")
    with open(where / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)


def hooked_train(nanogpt: Path, work: Path) -> None:
    """nanoGPT's train.py, model.py and configurator.py in ``work``, with the gradwatch lines added to train.py."""
    for name in ("model.py", "configurator.py"):
        shutil.copy(nanogpt / name, work / name)
    src = (nanogpt / "train.py").read_text()
    anchor = "optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)\n"
    log = 'print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")\n'
    if anchor not in src or log not in src:
        raise SystemExit(f"{nanogpt}/train.py is not the nanoGPT this script knows (its optimizer or print line moved)")
    src = src.replace(anchor, anchor + HOOK_INIT)
    src = src.replace(log, log + "        _gw.log({'loss': lossf})\n")
    (work / "train.py").write_text(src + "\n_gw.finish()\n")


def run_one(server_url: str, work: Path, name: str, iters: int) -> dict:
    overrides, _ = CONFIGS[name]
    args = [*TINY, *overrides, "--dataset=chars", f"--max_iters={iters}", f"--lr_decay_iters={iters}"]
    args += [f"--eval_interval={iters + 1}", f"--out_dir={work / ('out-' + name)}", "--min_lr=1e-4"]
    env = {**os.environ, "GW_NAME": name, "GW_SERVER": server_url}
    out = subprocess.run(
        [sys.executable, "train.py", *args], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise SystemExit(f"nanoGPT {name} failed:\n{out.stderr[-3000:]}")
    losses = [
        float(line.split("loss ")[1].split(",")[0]) for line in out.stdout.splitlines() if line.startswith("iter ")
    ]
    runs = _get(server_url, "/api/runs?project=nanogpt")
    run_id = next(r["id"] for r in runs if r["name"] == name)
    alerts = _get(server_url, f"/api/runs/{run_id}/alerts")
    first = min((a["step"] for a in alerts if a["step"] is not None), default=None)
    return {
        "config": name,
        "losses_first": losses[:6],
        "loss_last": losses[-1] if losses else None,
        "first_alert_step": first,
        "alerts": [{"kind": a["kind"], "step": a["step"], "message": a["message"]} for a in alerts],
    }


def _get(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=30) as resp:
        return json.loads(resp.read())


def ok(result: dict) -> bool:
    """Whether a configuration did what it should: alerted by its step, or raised nothing."""
    by = CONFIGS[result["config"]][1]
    first = result["first_alert_step"]
    return first is None if by is None else first is not None and first <= by


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nanogpt", default=os.environ.get("NANOGPT_DIR"), help="a nanoGPT checkout [$NANOGPT_DIR]")
    ap.add_argument("--which", choices=("bad", "healthy", "both"), default="both")
    ap.add_argument("--iters", type=int, default=60, help="training iterations per configuration [60]")
    ap.add_argument("--check", action="store_true", help="exit 1 unless both configurations behave")
    args = ap.parse_args(argv)
    if not args.nanogpt or not (Path(args.nanogpt) / "train.py").exists():
        ap.error("give a nanoGPT checkout: --nanogpt PATH or NANOGPT_DIR")
    from gradwatch_server.serve import BackgroundServer
    from gradwatch_server.settings import Settings

    names = ("bad", "healthy") if args.which == "both" else (args.which,)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        char_dataset(work / "data" / "chars")
        hooked_train(Path(args.nanogpt), work)
        server = BackgroundServer(Settings(host="127.0.0.1", port=0, db=f"sqlite:///{work / 'gw.db'}")).start()
        try:
            results = [run_one(server.url, work, name, args.iters) for name in names]
        finally:
            server.stop()
    for r in results:
        print(json.dumps({**r, "ok": ok(r)}))
    return 0 if not args.check or all(ok(r) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
