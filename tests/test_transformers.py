"""GradwatchCallback with the real transformers Trainer: a tiny GPT-2 built from a config, CPU, no downloads."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from gradwatch.transformers import GradwatchCallback  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "integrations" / "transformers.md"


def tiny_model():
    torch.manual_seed(0)
    return GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0)
    )


def data(n=32):
    tokens = torch.randint(0, 50, (n, 8), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": t, "labels": t} for t in tokens]


def args(tmp_path, **kwargs):
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        hub_token="hf_secret",
    )
    return TrainingArguments(**{**base, **kwargs})


def series(api, run_id, key):
    return api.get(f"/api/runs/{run_id}/series?key={key}")


def test_trainer_streams_config_logs_and_layer_norms(server, api, tmp_path):
    train = data()
    trainer = Trainer(
        model=tiny_model(),
        args=args(tmp_path, max_steps=6, max_grad_norm=0, eval_strategy="steps", eval_steps=3),
        train_dataset=train,
        eval_dataset=train[:8],
        callbacks=[GradwatchCallback(project="hf", name="gpt2", server=server.url)],
    )
    trainer.train()
    run = api.get("/api/runs")[0]
    assert (run["name"], run["status"]) == ("gpt2", "finished")
    config = api.get(f"/api/runs/{run['id']}")["config"]
    assert config["args"]["learning_rate"] == 1e-3 and config["args"]["hub_token"] == "***"
    assert config["args"]["include_num_input_tokens_seen"] in (False, "no")  # "token" inside a name is no secret
    assert config["model"]["n_layer"] == 2 and config["model"]["n_embd"] == 16
    rid = run["id"]
    assert series(api, rid, "loss")["steps"] == [1, 2, 3, 4, 5, 6]
    assert series(api, rid, "eval_loss")["steps"] == [3, 6]
    keys = api.get(f"/api/runs/{rid}/keys")
    assert {
        "grad/transformer.h.0.attn.c_attn.weight",
        "grad/transformer.h.1.mlp.c_proj.weight",
        "learning_rate",
        "lr",
    } <= set(keys)  # the Trainer's two parameter groups (with and without weight decay) share one rate: one line
    assert "lr/0" not in keys and "lr/1" not in keys
    # Our global norm (captured before each optimizer step) is the Trainer's own grad_norm, step for step.
    ours, theirs = series(api, rid, "grad/global_norm"), series(api, rid, "grad_norm")
    assert ours["steps"] == theirs["steps"] == [1, 2, 3, 4, 5, 6]
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(ours["values"], theirs["values"]))
    assert series(api, rid, "lr")["values"] == pytest.approx(series(api, rid, "learning_rate")["values"])
    assert series(api, rid, "lr")["values"][0] == 1e-3
    # The Trainer's optimizer reaches the watcher: update ratios, output RMS and the step timer.
    assert {"update_ratio/transformer.h.0.attn.c_attn.weight", "signals/update_ratio_max", "perf/step_time"} <= set(
        keys
    )
    assert any(k.startswith("act_rms/") for k in keys)
    assert set(series(api, rid, "perf/step_time")["steps"]) <= {1, 2, 3, 4, 5, 6}


class PoisonAt(TrainerCallback):
    """Puts a NaN into a weight after a given step: every later loss and gradient is NaN."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.transformer.wte.weight[0, 0] = float("nan")


def test_on_nan_stop_ends_training_through_the_trainer(server, api, tmp_path):
    trainer = Trainer(
        model=tiny_model(),
        args=args(tmp_path, max_steps=50),
        train_dataset=data(),
        callbacks=[PoisonAt(2), GradwatchCallback(project="hf", name="nan", server=server.url, on_nan="stop")],
    )
    trainer.train()
    assert trainer.state.global_step == 3  # the first NaN step was logged, and training stopped there
    run = api.get("/api/runs")[0]
    assert run["status"] == "finished" and run["last_step"] == 3
    assert math.isnan(float(series(api, run["id"], "grad_norm")["values"][-1]))
    kinds = {a["kind"] for a in api.get(f"/api/runs/{run['id']}/alerts")}
    assert "nonfinite_gradients" in kinds


def test_docs_example_runs(server, api, monkeypatch, tmp_path):
    monkeypatch.setenv("GRADWATCH_SERVER", server.url)
    monkeypatch.chdir(tmp_path)
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(code) == 1
    exec(
        compile(code[0].replace("/tmp/gradwatch-hf-example", str(tmp_path / "out")), str(DOC), "exec"),
        {"__name__": "docs_example"},
    )
    run = api.get("/api/runs")[0]
    assert (run["project"], run["name"], run["status"]) == ("hf", "tiny-gpt2", "finished")
    assert series(api, run["id"], "loss")["steps"] == list(range(1, 9))
    assert series(api, run["id"], "eval_loss")["steps"] == [4, 8]


def test_norms_are_read_before_the_trainer_clips_with_the_clipped_one_beside(server, api, tmp_path):
    trainer = Trainer(
        model=tiny_model(),
        args=args(tmp_path, max_steps=5, learning_rate=5.0, max_grad_norm=0.5),  # clipping bites every step
        train_dataset=data(),
        callbacks=[GradwatchCallback(project="hf", name="clip", server=server.url)],
    )
    trainer.train()
    rid = api.get("/api/runs")[0]["id"]
    ours, theirs = series(api, rid, "grad/global_norm"), series(api, rid, "grad_norm")
    clipped = series(api, rid, "grad/global_norm_clipped")
    assert ours["steps"] == theirs["steps"] == clipped["steps"] == [1, 2, 3, 4, 5]
    # grad_norm is the Trainer's pre-clip norm: ours matches it, not the clipped 0.5.
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(ours["values"], theirs["values"]))
    assert all(v > 0.5 for v in ours["values"])
    assert clipped["values"] == pytest.approx([0.5] * 5, rel=1e-3)
    # The per-layer norms are pre-clip too: they add up (in squares) to the pre-clip global norm.
    layers = api.get(f"/api/runs/{rid}/keys")
    names = [k for k in layers if k.startswith("grad/transformer.") or k.startswith("grad/lm_head")]
    total = sum(series(api, rid, k)["values"][0] ** 2 for k in names)
    assert math.isclose(total**0.5, ours["values"][0], rel_tol=1e-3)


def test_loss_streams_every_step_whatever_logging_steps_with_accumulation(server, api, tmp_path):
    trainer = Trainer(
        model=tiny_model(),
        args=args(tmp_path, max_steps=8, logging_steps=4, gradient_accumulation_steps=2, per_device_train_batch_size=4),
        train_dataset=data(),
        callbacks=[GradwatchCallback(project="hf", name="ga", server=server.url)],
    )
    logged = []

    class Keep(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if "loss" in logs:
                logged.append((state.global_step, logs["loss"]))

    trainer.add_callback(Keep())
    trainer.train()
    run = api.get("/api/runs")[0]
    loss = series(api, run["id"], "loss")
    assert loss["steps"] == list(range(1, 9))  # every optimizer step, not every 4th
    # The Trainer's logged loss is the mean over its window: ours, per step, averages to it.
    for step, theirs in logged:
        window = [v for s, v in zip(loss["steps"], loss["values"]) if step - 4 < s <= step]
        assert math.isclose(sum(window) / 4, theirs, rel_tol=1e-4), (step, window, theirs)
    assert api.get(f"/api/runs/{run['id']}")["meta"]["loss_key"] == "loss"


def test_training_resumed_from_a_checkpoint_continues_the_same_run(server, api, tmp_path):
    def make(max_steps):
        return Trainer(
            model=tiny_model(),
            args=args(tmp_path, max_steps=max_steps, save_strategy="steps", save_steps=4),
            train_dataset=data(),
            callbacks=[GradwatchCallback(project="hf", name="resumable", server=server.url)],
        )

    make(4).train()
    assert (tmp_path / "out" / "checkpoint-4" / "gradwatch.json").is_file()
    make(8).train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))  # as a new process would
    runs = api.get("/api/runs")
    assert len(runs) == 1 and runs[0]["status"] == "finished"
    assert series(api, runs[0]["id"], "loss")["steps"] == list(range(1, 9))  # 1-4, then 5-8 in the same run
