"""What connects gradwatch to the code around a training loop: frameworks, process groups, the LR range test.

One module per integration: ``lightning`` (a Lightning callback), ``transformers`` (a Hugging Face
``Trainer`` callback), ``distributed`` (torch.distributed ranks), ``lr_range`` (``gradwatch.lr_find``),
and ``step_watcher``, the watcher a framework drives. Each is importable under its old name too
(``gradwatch.lightning``, ``gradwatch.transformers``, ``gradwatch.distributed``, ``gradwatch.lr_range``).
"""
