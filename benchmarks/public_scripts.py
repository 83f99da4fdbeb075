"""Public training scripts nobody here wrote, run unchanged but for the README's gradwatch lines, on CPU.

Run: .venv/bin/python benchmarks/public_scripts.py [--quick]
Copies each script into a temporary folder (their code is never committed here), adds only the lines the
README shows (``import gradwatch``, ``gradwatch.init``, ``run.watch(...)``, ``run.log(...)``), builds their
data from local text (no downloads), runs them against a real server and checks what it stored:

- nanoGPT ``train.py`` (karpathy/nanoGPT; $GRADWATCH_NANOGPT, default /work/ext/nanoGPT), char-level on this
  repo's docs, clip 1.0, two AdamW groups, gradient accumulation: ``grad/global_norm`` is not a flat line at
  the clip, ``grad/global_norm_clipped`` never exceeds it, ``grad/clip_threshold`` is 1.0, one ``lr`` line.
- pytorch/examples ``time_sequence_prediction`` (LBFGS with a closure; $GRADWATCH_PYTORCH_EXAMPLES, default
  /work/ext/pytorch-examples; its data generator run with 8 waves of 100 points; matplotlib, only used for
  its plots, is stubbed when missing): step 0 has every
  gradient, the closure's loss logs land on the step being taken.
- pytorch/examples ``word_language_model`` (an LSTM, clip 0.25, with ``--use-optimizer``) on this repo's docs.

(``dcgan`` needs torchvision and ``mnist_hogwild`` MNIST; their shapes are run by tests/test_gradients.py.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from server_process import ServerProcess, get_json  # noqa: E402

NANOGPT = Path(os.environ.get("GRADWATCH_NANOGPT", "/work/ext/nanoGPT"))
EXAMPLES = Path(os.environ.get("GRADWATCH_PYTORCH_EXAMPLES", "/work/ext/pytorch-examples"))
MATPLOTLIB_STUB = "def use(*a, **k):\n    pass\n"
PYPLOT_STUB = "def __getattr__(name):\n    return lambda *a, **k: None\n"


def local_text() -> str:
    """Text to train on: this repository's own docs."""
    return "\n".join(p.read_text() for p in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]))


def patch(path: Path, edits: list[tuple[str, str]]) -> None:
    """Insert each ``added`` text after the first line that contains ``anchor`` (with that line's indent)."""
    lines = path.read_text().splitlines()
    for anchor, added in edits:
        at = next(i for i, line in enumerate(lines) if anchor in line)
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        if lines[at].rstrip().endswith(":"):
            indent += "    "
        lines[at + 1 : at + 1] = [indent + a for a in added.splitlines()]
    path.write_text("\n".join(lines) + "\n")


def run_script(folder: Path, argv: list[str], url: str, timeout: float, **extra_env: str) -> str:
    env = {**os.environ, "GRADWATCH_SERVER": url, "PYTHONPATH": str(folder), **extra_env}
    out = subprocess.run([sys.executable, *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return out.stdout


def series(url: str, rid: int, key: str) -> dict:
    return get_json(f"{url}/api/runs/{rid}/series?key={key}")


def nanogpt(tmp: Path, url: str, iters: int) -> dict:
    folder = tmp / "nanoGPT"
    (folder / "data" / "local_char").mkdir(parents=True)
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / name, folder / name)
    shutil.copy(NANOGPT / "data" / "shakespeare_char" / "prepare.py", folder / "data" / "local_char" / "prepare.py")
    (folder / "data" / "local_char" / "input.txt").write_text(local_text())  # prepare.py downloads only without it
    subprocess.run([sys.executable, "prepare.py"], cwd=folder / "data" / "local_char", check=True, capture_output=True)
    patch(
        folder / "train.py",
        [
            (
                "optimizer = model.configure_optimizers(",
                "import gradwatch\nrun = gradwatch.init(project='public', name='nanoGPT')\nrun.watch(model, optimizer)",
            ),
            ('print(f"iter {iter_num}: loss', "run.log({'loss': lossf})"),
        ],
    )
    argv = ["train.py", "--device=cpu", "--compile=False", "--dtype=float32", "--dataset=local_char",
            "--batch_size=8", "--block_size=32", "--n_layer=2", "--n_head=2", "--n_embd=64", "--dropout=0.0",
            f"--max_iters={iters}", "--lr_decay_iters=100", "--warmup_iters=2", "--eval_interval=100000",
            "--eval_iters=1", "--log_interval=1", "--gradient_accumulation_steps=2", "--learning_rate=3e-3",
            "--always_save_checkpoint=False", "--wandb_log=False"]  # fmt: skip
    run_script(folder, argv, url, timeout=600)
    rid = get_json(f"{url}/api/runs?project=public")[0]["id"]
    norms = series(url, rid, "grad/global_norm")["values"]
    clipped = series(url, rid, "grad/global_norm_clipped")["values"]
    keys = get_json(f"{url}/api/runs/{rid}/keys")
    checks = {
        "pre-clip norm above the clip at some step (not flat at 1.0)": max(norms) > 1.0,
        "clipped norm never above 1.0": max(clipped) <= 1.0 + 1e-4,
        "clip threshold 1.0": set(series(url, rid, "grad/clip_threshold")["values"]) == {1.0},
        "one LR line for two AdamW groups": "lr" in keys and not any(k.startswith("lr/") for k in keys),
        "loss at every iteration": series(url, rid, "loss")["steps"] == list(range(iters + 1)),
        "norms at every iteration": series(url, rid, "grad/global_norm")["steps"] == list(range(iters + 1)),
    }
    return {"run": rid, "steps": len(norms), "max pre-clip": max(norms), "checks": checks}


def time_sequence(tmp: Path, url: str, steps: int) -> dict:
    folder = tmp / "time_sequence_prediction"
    shutil.copytree(EXAMPLES / "time_sequence_prediction", folder)
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # only its plots use it
        (folder / "matplotlib").mkdir()
        (folder / "matplotlib" / "__init__.py").write_text(MATPLOTLIB_STUB)
        (folder / "matplotlib" / "pyplot.py").write_text(PYPLOT_STUB)
    # Its generate_sine_wave.py, smaller (100 waves of 1000 points take minutes per LBFGS step on a shared CPU).
    gen = (folder / "generate_sine_wave.py").read_text().replace("L = 1000", "L = 100").replace("N = 100", "N = 8")
    (folder / "generate_small.py").write_text(gen)
    subprocess.run([sys.executable, "generate_small.py"], cwd=folder, check=True, capture_output=True)
    patch(
        folder / "train.py",
        [
            (
                "optimizer = optim.LBFGS(",
                "import gradwatch\nrun = gradwatch.init(project='public-lbfgs', "
                "name='time_sequence_prediction')\nrun.watch(seq, optimizer)",
            ),
            ("print('loss:', loss.item())", "run.log({'loss': loss})"),
        ],
    )
    # Its torch.load of a numpy array predates torch 2.6's weights_only default: the documented switch back.
    run_script(folder, ["train.py", f"--steps={steps}"], url, timeout=600, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    rid = get_json(f"{url}/api/runs?project=public-lbfgs")[0]["id"]
    keys = get_json(f"{url}/api/runs/{rid}/keys")
    layers = [k for k in keys if k.startswith("grad/") and k.split("/", 1)[1][:4] in ("lstm", "line")]
    first = [series(url, rid, k) for k in layers]
    checks = {
        "step 0 has every gradient": all(s["steps"][0] == 0 and s["values"][0] for s in first),
        "closure logs on the step being taken": sorted(set(series(url, rid, "loss")["steps"])) == list(range(steps)),
        "no missing gradient": set(series(url, rid, "grad/missing_count")["values"]) == {0.0},
    }
    return {"run": rid, "layers": len(layers), "checks": checks}


def word_language_model(tmp: Path, url: str, batches: int) -> dict:
    folder = tmp / "word_language_model"
    shutil.copytree(EXAMPLES / "word_language_model", folder, ignore=shutil.ignore_patterns("data"))
    words = local_text().split()
    data = folder / "data" / "local"
    data.mkdir(parents=True)
    cut = len(words) * 8 // 10
    (data / "train.txt").write_text(" ".join(words[:cut]))
    (data / "valid.txt").write_text(" ".join(words[cut:]))
    (data / "test.txt").write_text(" ".join(words[cut:]))
    patch(
        folder / "main.py",
        [
            (
                "optimizer = torch.optim.AdamW(",
                "import gradwatch\nrun = gradwatch.init(project='public-lm', "
                "name='word_language_model')\nrun.watch(model, optimizer)",
            ),
            ("total_loss += loss.item()", "run.log({'loss': loss})\nif batch + 1 >= " + str(batches) + ":\n    break"),
        ],
    )
    argv = ["main.py", "--data=./data/local", "--epochs=1", "--emsize=32", "--nhid=32", "--bptt=20",
            "--batch_size=8", "--use-optimizer", "--lr=0.003", "--save=model.pt"]  # fmt: skip
    # It saves and reloads the whole model with torch.load (weights_only=True since torch 2.6 refuses its class).
    run_script(folder, argv, url, timeout=600, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    rid = get_json(f"{url}/api/runs?project=public-lm")[0]["id"]
    norms = series(url, rid, "grad/global_norm")["values"]
    clipped = series(url, rid, "grad/global_norm_clipped")["values"]
    checks = {
        "pre-clip norm above the clip (0.25) at some step": max(norms) > 0.25,
        "clipped norm never above 0.25": max(clipped) <= 0.25 + 1e-4,
        "one point per batch": series(url, rid, "loss")["steps"] == list(range(len(norms))),
    }
    return {"run": rid, "steps": len(norms), "max pre-clip": max(norms), "checks": checks}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    args = ap.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(f"sqlite:///{tmp}/public.db")
        try:
            jobs = {
                "nanoGPT train.py": (NANOGPT, lambda: nanogpt(Path(tmp), server.url, 10 if args.quick else 40)),
                "time_sequence_prediction (LBFGS)": (EXAMPLES, lambda: time_sequence(Path(tmp), server.url, 2)),
                "word_language_model (LSTM, clip)": (
                    EXAMPLES,
                    lambda: word_language_model(Path(tmp), server.url, 20 if args.quick else 80),
                ),
            }
            for name, (source, job) in jobs.items():
                if not source.is_dir():
                    print(f"{name}: skipped, no copy at {source}")
                    continue
                result = job()
                checks = result.pop("checks")
                failed += sum(not ok for ok in checks.values())
                print(f"{name}: {result}")
                for what, ok in checks.items():
                    print(f"    {'ok  ' if ok else 'FAIL'} {what}")
        finally:
            server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
