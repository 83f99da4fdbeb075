"""gradwatch import-tb: real TensorBoard event files (torch's SummaryWriter) into runs via the real client."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorboard")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

from gradwatch_server import cli  # noqa: E402


def write_logs(root):
    """Two runs as TensorBoard writes them: root/baseline and root/big_lr/seed1."""
    walls = {}
    for sub, scale in (("baseline", 1.0), ("big_lr/seed1", 3.0)):
        with SummaryWriter(str(root / sub)) as w:
            for step in range(0, 50, 5):
                wall = 1_700_000_000.0 + step
                w.add_scalar("Loss/train", scale / (step + 1), step, walltime=wall)
                w.add_scalar("lr", 0.1 * scale, step, walltime=wall)
                walls[(sub, step)] = wall
            w.add_scalar("Loss/train", float("nan"), 50, walltime=1_700_000_050.0)
    return walls


def test_import_tb_brings_every_scalar_in(server, api, tmp_path, capsys):
    walls = write_logs(tmp_path / "logs")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["import-tb", str(tmp_path / "logs"), "--server", server.url, "--project", "old"])
    err = capsys.readouterr().err
    assert exit_.value.code == 0 and "import-tb 2 run(s): points" in err and "-> run" in err
    runs = sorted(api.get("/api/runs"), key=lambda r: r["name"])
    assert [(r["name"], r["project"], r["status"]) for r in runs] == [
        ("baseline", "old", "finished"),
        ("big_lr/seed1", "old", "finished"),
    ]
    big = runs[1]
    assert "tensorboard" in big["tags"]
    assert api.get(f"/api/runs/{big['id']}")["config"]["imported_from"].endswith("big_lr/seed1")
    loss = api.get(f"/api/runs/{big['id']}/series?key=Loss/train")
    assert loss["steps"] == list(range(0, 55, 5))
    assert loss["values"][:-1] == pytest.approx([3.0 / (s + 1) for s in range(0, 50, 5)], rel=1e-6)
    assert loss["values"][-1] == "NaN"
    assert loss["wall_times"][:10] == [walls[("big_lr/seed1", s)] for s in range(0, 50, 5)]  # original times
    assert api.get(f"/api/runs/{big['id']}/series?key=lr")["values"] == pytest.approx([0.3] * 10)


def test_import_tb_without_event_files_says_so(server, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["import-tb", str(tmp_path / "empty"), "--server", server.url])
    assert exit_.value.code == 1 and "no TensorBoard event files" in capsys.readouterr().err


def test_bad_records_are_skipped_and_reported_never_claimed(server, api, tmp_path, capsys):
    """Issue #18: a 300-character tag, a negative step and a record header claiming 64 GiB are each
    skipped with a line saying so; the good points arrive and the count printed is what was sent."""
    import struct

    root = tmp_path / "logs"
    with SummaryWriter(str(root / "bad")) as w:
        for step in range(5):
            w.add_scalar("loss", 1.0 / (step + 1), step)
        w.add_scalar("x" * 300, 1.0, 1)
        w.add_scalar("loss", 9.0, -3)
    (event_file,) = (root / "bad").glob("events.out.tfevents.*")
    with open(event_file, "ab") as f:  # a record that claims 64 GiB, then garbage
        f.write(struct.pack("<Q", 64 << 30) + b"\0" * 4 + b"junk" * 10)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["import-tb", str(root), "--server", server.url])
    err = capsys.readouterr().err
    assert exit_.value.code == 0 and "Traceback" not in err and "MemoryError" not in err
    assert "5 points -> run" in err
    assert "tag longer than 256" in err and "step negative" in err and "corrupt" in err
    (run,) = api.get("/api/runs")
    loss = api.get(f"/api/runs/{run['id']}/series?key=loss")
    assert loss["steps"] == [0, 1, 2, 3, 4]
    alerts = api.get(f"/api/runs/{run['id']}/alerts")
    assert not [a for a in alerts if a["kind"] == "data_refused"]  # nothing was sent that the server refused


def test_import_tb_brings_histograms_and_images_too(server, api, tmp_path, capsys):
    import numpy as np
    import torch

    with SummaryWriter(str(tmp_path / "logs" / "dist")) as w:
        for step in range(3):
            values = (
                torch.randn(1000, generator=torch.Generator().manual_seed(step)) + step
            )  # seeded: edges snap to a grid
            w.add_histogram("weights/fc", values, step, walltime=1_700_000_000.0 + step)
            w.add_image("samples", np.full((3, 8, 6), 0.5 * step, dtype=np.float32), step)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["import-tb", str(tmp_path / "logs"), "--server", server.url])
    assert exit_.value.code == 0, capsys.readouterr().err
    (run,) = api.get("/api/runs")
    kinds = {m["key"]: (m["kind"], m["steps"]) for m in api.get(f"/api/runs/{run['id']}/media")}
    assert kinds == {"weights/fc": ("histogram", 3), "samples": ("image", 3)}
    hists = api.get(f"/api/runs/{run['id']}/histograms?key=weights/fc")["histograms"]
    assert [sum(h["counts"]) for h in hists] == [1000] * 3 and all(
        len(h["edges"]) == len(h["counts"]) + 1 for h in hists
    )
    assert hists[2]["edges"][0] > hists[0]["edges"][0]  # the distribution moved
    image = api.get(f"/api/runs/{run['id']}/images?key=samples&step=1")["images"][0]
    assert (image["width"], image["height"]) == (6, 8)
