"""Real scripts written for W&B, run with only ``import wandb`` changed to ``import gradwatch as wandb``.

Run: .venv/bin/python benchmarks/wandb_swaps.py [--nanogpt DIR] [--dcgan DIR] [--keep]
     (defaults /work/ext/nanoGPT and /work/ext/pytorch-examples/dcgan; their code is copied to a temporary
     directory and never kept in this repository)

- nanoGPT's ``train.py`` with ``wandb_log=True``, a tiny CPU config and a character dataset built from this
  repository's own docs (no download): the one changed line is its ``import wandb``.
- pytorch/examples' DCGAN ``main.py`` with ``--dataset fake``: it has no W&B calls of its own, so the calls a
  W&B user adds (init with the argparse config, watch(netD, log="all"), log of both losses, an Image of the
  generator's samples) are inserted as that user would write them, with ``import gradwatch as wandb``.
  Where torchvision is not installed, a small stand-in (FakeData, the transforms it uses, save_image) is put
  on the path; say so in what you report.

Each script runs in its own process against a real ``gradwatch serve``; the run is then read back through
``gradwatch.Api`` and the script fails (exit 1) unless what the script logged is there.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

from server_process import ServerProcess  # noqa: E402

from gradwatch import Api  # noqa: E402

NANOGPT_ARGS = [
    "--dataset=localchar",
    "--device=cpu",
    "--compile=False",
    "--dtype=float32",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=32",
    "--batch_size=4",
    "--gradient_accumulation_steps=1",
    "--max_iters=30",
    "--lr_decay_iters=30",
    "--warmup_iters=2",
    "--eval_interval=10",
    "--eval_iters=2",
    "--log_interval=5",
    "--dropout=0.0",
    "--wandb_log=True",
    "--wandb_project=nanogpt-swap",
    "--wandb_run_name=tiny-char",
    "--always_save_checkpoint=False",
]

DCGAN_CALLS = {  # after which line of main.py a W&B user adds which call
    "import torchvision.utils as vutils\n": "import gradwatch as wandb\n",
    "optimizerG = optim.Adam(": None,  # marker: init/watch go after the optimizer block
    "        optimizerG.step()\n": (
        "        wandb.log({'Loss_D': errD.item(), 'Loss_G': errG.item(), 'D(x)': D_x, 'D(G(z))': D_G_z2})\n"
    ),
    "            fake = netG(fixed_noise)\n": (
        "            wandb.log({'samples': [wandb.Image(img, caption=f'epoch {epoch}') for img in fake.detach()[:4]]})\n"
    ),
}
DCGAN_SETUP = "wandb.init(project='dcgan-swap', name='fake', config=opt)\nwandb.watch(netD, log='all', log_freq=2)\n"

TORCHVISION_STANDIN = {  # only what dcgan/main.py calls with --dataset fake
    "torchvision/__init__.py": "",
    "torchvision/datasets.py": (
        "import torch\n"
        "class FakeData(torch.utils.data.Dataset):\n"
        "    def __init__(self, image_size=(3, 64, 64), transform=None, size=1000, **_):\n"
        "        self.shape, self.size = image_size, size\n"
        "    def __len__(self):\n        return self.size\n"
        "    def __getitem__(self, i):\n"
        "        g = torch.Generator().manual_seed(i)\n"
        "        return torch.rand(self.shape, generator=g) * 2 - 1, 0\n"
    ),
    "torchvision/transforms.py": (
        "class _Step:\n    def __init__(self, *a, **k):\n        pass\n"
        "    def __call__(self, x):\n        return x\n"
        "Compose = Resize = CenterCrop = ToTensor = Normalize = _Step\n"
    ),
    "torchvision/utils.py": "def save_image(*args, **kwargs):\n    pass\n",
}


def swap_import(text: str) -> str:
    """The one-line change: ``import wandb`` -> ``import gradwatch as wandb``."""
    assert "    import wandb\n" in text, "train.py no longer imports wandb where it used to"
    return text.replace("    import wandb\n", "    import gradwatch as wandb\n", 1)


def char_dataset(where: Path) -> None:
    """nanoGPT's shakespeare_char format (train.bin, val.bin, meta.pkl) from this repository's docs."""
    import numpy as np

    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    cut = int(len(ids) * 0.9)
    where.mkdir(parents=True, exist_ok=True)
    ids[:cut].tofile(where / "train.bin")
    ids[cut:].tofile(where / "val.bin")
    with open(where / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)


def run_nanogpt(source: Path, work: Path, env: dict) -> subprocess.CompletedProcess:
    dest = work / "nanoGPT"
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("*.ipynb", "assets", ".git"))
    (dest / "train.py").write_text(swap_import((dest / "train.py").read_text()))
    char_dataset(dest / "data" / "localchar")
    return subprocess.run(
        [sys.executable, "train.py", *NANOGPT_ARGS], cwd=dest, env=env, capture_output=True, text=True, timeout=900
    )


def run_dcgan(source: Path, work: Path, env: dict) -> subprocess.CompletedProcess:
    dest = work / "dcgan"
    dest.mkdir()
    text = (source / "main.py").read_text()
    for after, call in DCGAN_CALLS.items():
        assert after in text, f"dcgan/main.py changed: no {after.strip()!r}"
        if call is not None:
            text = text.replace(after, after + call, 1)
    block_end = text.index("\n", text.index("optimizerG = optim.Adam(")) + 1
    text = text[:block_end] + DCGAN_SETUP + text[block_end:]
    (dest / "main.py").write_text(text)
    try:
        import torchvision  # noqa: F401
    except ImportError:
        for name, body in TORCHVISION_STANDIN.items():
            (dest / "standin" / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / "standin" / name).write_text(body)
        env = {**env, "PYTHONPATH": str(dest / "standin")}
    args = ["--dataset", "fake", "--niter", "1", "--batchSize", "8", "--imageSize", "64", "--workers", "0"]
    args += ["--ngf", "16", "--ndf", "16", "--outf", str(dest), "--manualSeed", "1"]
    return subprocess.run(
        [sys.executable, "main.py", *args, "--dry-run"], cwd=dest, env=env, capture_output=True, text=True, timeout=900
    )


def check(api: Api, project: str, want_keys: set, want_media: set) -> list[str]:
    """What is missing from the project's run (empty: everything the script logged is there)."""
    runs = api.runs(project=project)
    if len(runs) != 1:
        return [f"{project}: {len(runs)} runs, expected 1"]
    run = runs[0]
    missing = [f"{project}: key {k}" for k in sorted(want_keys - set(run.keys()))]
    kinds = {m["kind"] for m in run.media()}
    missing += [f"{project}: no {k}" for k in sorted(want_media - kinds)]
    if run.status != "finished":
        missing.append(f"{project}: status {run.status}")
    return missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", default="/work/ext/nanoGPT")
    parser.add_argument("--dcgan", default="/work/ext/pytorch-examples/dcgan")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (and print it)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gradwatch-swaps-"))
    problems: list[str] = []
    try:
        with ServerProcess(f"sqlite:///{work}/swaps.db") as server:
            env = {**os.environ, "GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL_DIR": str(work / "spool")}
            api = Api(server.url)
            for name, fn, project, keys, media in (
                ("nanoGPT", lambda: run_nanogpt(Path(args.nanogpt), work, env), "nanogpt-swap",
                 {"train/loss", "val/loss", "lr", "iter", "mfu"}, set()),
                ("dcgan", lambda: run_dcgan(Path(args.dcgan), work, env), "dcgan-swap",
                 {"Loss_D", "Loss_G"}, {"image", "histogram"}),
            ):  # fmt: skip
                done = fn()
                print(f"{name}: exit {done.returncode}", file=sys.stderr)
                if done.returncode:
                    problems.append(f"{name} exited {done.returncode}: {done.stderr[-1500:]}")
                    continue
                problems += check(api, project, keys, media)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    for problem in problems:
        print(f"MISSING {problem}", file=sys.stderr)
    print(
        "OK: both scripts ran with the one-line swap and everything they logged is on the server"
        if not problems
        else "FAILED"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
