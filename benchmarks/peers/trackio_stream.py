"""Run in trackio's own venv by bench_storage.py: log a stream through trackio, print its files' bytes.

Usage: <trackio venv>/bin/python trackio_stream.py STREAM.npz DIR

STREAM.npz holds ``steps`` (the step numbers) and one array per key (``key:<name>``), or ``layers``
(steps x layers, logged as ``grad/layer<j>``). trackio writes under DIR (``TRACKIO_DIR``); each
SQLite file there is checkpointed and VACUUMed, and the total is printed as one JSON line.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path


def main() -> None:
    stream, root = Path(sys.argv[1]), Path(sys.argv[2])
    os.environ["TRACKIO_DIR"] = str(root / "trackio")  # read when trackio is imported
    os.environ["HF_HOME"] = str(root / "hf")
    import numpy as np
    import trackio

    data = np.load(stream)
    keys = {name[4:]: data[name] for name in data.files if name.startswith("key:")}
    layers = data["layers"] if "layers" in data.files else None
    run = trackio.init(project="bench", name="storage", auto_log_cpu=False, auto_log_gpu=False)
    for i, step in enumerate(data["steps"].tolist()):
        record = {key: float(values[i]) for key, values in keys.items()}
        if layers is not None:
            record.update((f"grad/layer{j}", float(v)) for j, v in enumerate(layers[i].tolist()))
        run.log(record, step=step)
    run.finish()
    total = 0
    for path in (root / "trackio").rglob("*.db"):
        con = sqlite3.connect(path)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("VACUUM")
        con.close()
        total += sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    print(json.dumps({"bytes": total, "version": trackio.__version__}))


if __name__ == "__main__":
    main()
