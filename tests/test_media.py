"""Media values on the client: Histogram, Image, Table and Text captured without a host-device sync,
encoded on the sender thread, and every bad input a counted refusal, never an exception."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradwatch.media import Histogram, Image, Table, Text, limits, png
from gradwatch.media.outgoing import Outbound
from gradwatch.media.route import split
from gradwatch.values import Encoder

# Ops that read a device value back to the host (each a sync on a GPU): .item(), bool(), boolean indexing.
SYNCING = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique2", "aten::bincount"}


class CountSyncs(TorchDispatchMode):
    """Counts the ops a CUDA tensor would sync on, run on CPU (the way the GPU check counts them, without a GPU)."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split(".")[0]
        masked = name == "aten::index" and any(getattr(i, "dtype", None) == torch.bool for i in args[1])
        if name in SYNCING or masked:  # boolean-mask indexing needs the count of True values: a sync
            self.syncs.append("aten::nonzero" if masked else name)
        return func(*args, **(kwargs or {}))


def encode(items, features=("columns", "media")):
    out = Outbound()
    batches = Encoder(None, out).encode([out.item(*i) for i in items], 1, set(features))
    msgs = [json.loads(text) for _seq, text, _n in batches]
    return [e for m in msgs for e in m.get("media", [])], [e for m in msgs for e in m.get("events", [])], out


def test_histogram_bins_on_device_without_a_sync_and_counts_nonfinite_apart():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    x[:3] = float("nan")
    x[3] = float("inf")
    x[4:6] = float("-inf")
    from gradwatch.media.histogram import bin_tensor

    with CountSyncs() as mode:
        row = bin_tensor(torch, x, 32)
    assert mode.syncs == []
    lo, hi, nan, inf, ninf, *counts = row.tolist()
    finite = x[torch.isfinite(x)]
    assert (lo, hi) == (finite.min().item(), finite.max().item())
    assert (nan, inf, ninf) == (3, 1, 2) and sum(counts) == finite.numel() == 10_000 - 6
    expected, _ = np.histogram(finite.numpy(), bins=32, range=(lo, hi))
    assert np.abs(np.array(counts) - expected).sum() <= 4  # float rounding at bin edges only


def test_histogram_capture_on_the_training_thread_does_not_sync():
    w = torch.randn(64, 64)
    with CountSyncs() as mode:
        h = Histogram(w, num_bins=16)
        Histogram(torch.arange(100), num_bins=8)
        split({"loss": 1.0, "dist": w, "nested": {"a": 2.0, "text": "hi"}})
    assert mode.syncs == [] and h.refused is None
    w.add_(100)  # an optimizer step after log(): the histogram keeps what was logged
    (entry,), _, _ = encode([(0, "w", h)])
    assert entry["kind"] == "histogram" and entry["value"]["hi"] < 50 and sum(entry["value"]["counts"]) == 64 * 64


def test_log_splits_numbers_media_nested_dicts_and_strings():
    plain, media = split(
        {"loss": 1.0, "t": torch.tensor(2.0), "d": {"x": 1, "y": {"z": 3.0}}, "s": "text", "w": np.ones(5)}
    )
    assert set(plain) == {"loss", "t", "d/x", "d/y/z"}
    assert isinstance(media["s"], Text) and isinstance(media["w"], Histogram)


def test_image_png_and_table_round_trip_through_the_encoder():
    img = np.zeros((4, 6, 3), dtype=np.uint8)
    img[1, 2] = (255, 0, 10)
    chw = torch.rand(3, 5, 7)
    table = Table(columns=["name", "score"], data=[["a", 1.5], ["b", float("nan")]])
    entries, events, _ = encode([(2, "img", [Image(img, caption="one"), Image(chw)]), (2, "tab", table)])
    assert not events
    image, tab = entries
    first, second = image["value"]["images"]
    assert (first["width"], first["height"], first["caption"]) == (6, 4, "one") and (
        second["width"],
        second["height"],
    ) == (7, 5)
    assert tab["value"] == {"columns": ["name", "score"], "rows": [["a", 1.5], ["b", "NaN"]]}


def test_pure_zlib_png_is_a_valid_png():
    pixels = bytes(range(2 * 3 * 3))
    data = png.encode(pixels, 3, 2, 3)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and png.size_of(data) == (3, 2)
    length = struct.unpack(">I", data[33:37])[0]
    raw = zlib.decompress(data[41 : 41 + length])
    assert raw == b"\x00" + pixels[:9] + b"\x00" + pixels[9:]
    pil = pytest.importorskip("PIL.Image")
    import io

    assert pil.open(io.BytesIO(data)).convert("RGB").tobytes() == pixels


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("big_image", lambda: Image(np.zeros((6000, 6000, 3), dtype=np.uint8)), "over the limit"),  # ~100 MB
        ("huge_hist", lambda: Histogram(torch.empty(100_000_000, dtype=torch.float16)), "over the limit"),
        ("long_table", lambda: Table(columns=["a"], data=[[i] for i in range(1_000_000)]), "over the limit"),
        ("complex", lambda: Histogram(torch.zeros(4, dtype=torch.complex64)), "dtype"),
        ("odd", lambda: Image(object()), "cannot make an image"),
        ("mixed", lambda: [Image(np.zeros((2, 2))), Histogram([1.0, 2.0])], "images only"),
    ],
)
def test_bad_input_is_a_counted_gap_with_one_line(key, value, why, capsys):
    entries, events, out = encode([(5, key, value()), (5, "ok", Text("fine"))])
    assert [e["key"] for e in entries] == ["ok"]
    (gap,) = events
    assert gap["kind"] == "data_gap" and gap["step"] == 5 and why in gap["message"]
    lines = [line for line in capsys.readouterr().err.splitlines() if "not kept" in line]
    assert len(lines) == 1 and why in lines[0]
    assert sum(out.refusals.values()) == 1


def test_nan_tensor_histogram_and_image_are_kept():
    x = torch.full((10,), float("nan"))
    entries, events, _ = encode([(1, "h", Histogram(x)), (1, "i", Image(torch.full((3, 4, 4), float("nan"))))])
    assert not events and entries[0]["value"]["nan"] == 10 and sum(entries[0]["value"]["counts"]) == 0
    assert entries[1]["value"]["images"][0]["width"] == 4


def test_step_budget_refuses_what_is_over_it():
    out = Outbound()
    big = Table(columns=["a"], data=[["x" * 100] for _ in range(5000)])
    items = [out.item(0, f"t{i}", big) for i in range(30)]
    refused = [i for i in items if i[4].kind == "refused"]
    assert refused and sum(i[5] for i in items) <= limits.MAX_STEP_BYTES


def test_an_older_server_without_media_gets_a_gap_not_an_error():
    entries, events, _ = encode([(0, "h", Histogram([1.0, 2.0]))], features=("columns",))
    assert entries == [] and "older gradwatch server" in events[0]["message"]


def test_the_sync_counter_sees_a_sync():
    x = torch.randn(10)
    with CountSyncs() as mode:
        x.sum().item()
        x[x > 0]  # noqa: B018
    assert "aten::_local_scalar_dense" in mode.syncs and "aten::nonzero" in mode.syncs


def watched_loop_syncs(tmp_path, histograms, with_optimizer=True, dtype=torch.float32):
    """Syncs a CPU training loop's thread would make on a device, watched with or without histograms.

    ``dtype=torch.bfloat16``: the parameters take the device path (stacked and binned by torch ops, as on a GPU)."""
    import gradwatch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    spool = str(tmp_path / f"s{histograms}{with_optimizer}{dtype}")
    run = gradwatch.init(project="m", server="http://127.0.0.1:9", mode="offline", spool_dir=spool)
    run.watch(model, opt if with_optimizer else None, every=2, histograms=histograms, system_every=None)
    x, y = torch.randn(4, 8, dtype=dtype), torch.randn(4, 1, dtype=dtype)
    with CountSyncs() as mode:
        for step in range(6):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if not with_optimizer:
                run.log({"loss": 1.0}, step=step)
    outbound = run.recorder.sender.encoder.media
    run.finish()
    return mode.syncs, outbound


@pytest.mark.parametrize(
    "with_optimizer, dtype", [(True, torch.float32), (False, torch.float32), (True, torch.bfloat16)]
)
def test_watch_histograms_add_no_sync_on_the_training_thread(tmp_path, with_optimizer, dtype):
    without, _ = watched_loop_syncs(tmp_path, None, with_optimizer, dtype)
    with_histograms, outbound = watched_loop_syncs(tmp_path, "all", with_optimizer, dtype)
    assert with_histograms == without  # what watch() itself reads is its own business (its tests count it)
    assert outbound.put_count == 3 * 4 * 2 and not outbound.refusals  # steps 0, 2, 4 x 4 parameters x (grad, weight)


def test_small_cpu_histograms_binned_together_match_one_by_one():
    from gradwatch.media.histogram import bin_many, bin_tensor

    odd = torch.randn(100)
    odd[[3, 50]] = float("nan")
    odd[7] = -float("inf")
    tensors = [torch.randn(100), torch.randn(4096) * 3, torch.tensor([1.0, float("nan"), float("inf"), -2.0])]
    tensors += [odd, torch.randn(100) + 5, torch.full((100,), 2.5), torch.full((100,), float("nan"))]  # one size
    tensors.append(torch.arange(100, dtype=torch.int64))
    for t, row in zip(tensors, bin_many(torch, tensors, 16)):
        one = bin_tensor(torch, t, 16).tolist()
        assert row[:5] == pytest.approx(one[:5]) and sum(row[5:]) == sum(one[5:])
        assert sum(abs(a - b) for a, b in zip(row[5:], one[5:])) <= 2  # float32 rounding at bin edges only


def test_a_watch_capture_binned_on_its_device_does_not_sync():
    from gradwatch.media.histogram_group import HistogramGroup

    model = torch.nn.Sequential(torch.nn.Linear(100, 50), torch.nn.Linear(50, 3)).to(torch.bfloat16)
    model(torch.randn(4, 100, dtype=torch.bfloat16)).sum().backward()
    tensors = [(f"g/{n}", p.grad) for n, p in model.named_parameters()] + list(model.named_parameters())
    with CountSyncs() as mode:
        group = HistogramGroup(tensors, 16, 1024, on_device=True)  # what a GPU's tensors take
    assert mode.syncs == [] and group.refused is None and len(group.deferred()) == 4  # 4 shapes: 4 binned matrices
    heads, counts = group.binned()  # the sender thread reads them
    assert group.scale == [5, 1, 1, 1] * 2  # 5,000 weights: one run of 64 in every 320 (15 runs), the rest all
    assert counts.sum(1).tolist() == [15 * 64, 50, 150, 3] * 2 and all(
        h[0] <= h[1] and h[2:] == [0, 0, 0] for h in heads
    )


def test_rows_binned_at_once_on_a_device_match_bin_tensor_row_by_row():
    from gradwatch.media.histogram import bin_rows, bin_rows_tensor, bin_tensor

    torch.manual_seed(0)
    x = torch.randn(7, 300) * torch.arange(1, 8)[:, None]
    x[1, [3, 50]] = float("nan")
    x[2, 7] = -float("inf")
    x[3, 9] = float("inf")
    x[4] = 2.5  # constant
    x[5] = float("nan")  # nothing finite
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        rows = bin_rows_tensor(torch, x.to(dtype), 16).tolist()
        assert rows == [bin_tensor(torch, row, 16).tolist() for row in x.to(dtype)]
    heads, counts = bin_rows(torch, [([0, 1, 2, 3, 4, 5, 6], x.numpy())], 7, 16)  # numpy, on the sender thread
    for i, row in enumerate(bin_rows_tensor(torch, x, 16).tolist()):
        assert heads[i] == pytest.approx(row[:5], nan_ok=True) and counts[i].tolist() == row[5:]


def test_a_sampled_histogram_keeps_the_shape_and_the_size_of_a_big_tensor():
    from gradwatch.media.histogram import RUN

    torch.manual_seed(0)
    big = torch.randn(300_000, requires_grad=True)  # a parameter: CPU, float32, requires grad
    full = Histogram(big.detach().numpy().copy(), num_bins=16).to_wire()  # every value
    sampled = Histogram(big, num_bins=16, sample=4096).to_wire()
    k = sampled["sampled"]
    assert k == -(-300_000 // 4096)
    assert 300_000 - k * RUN <= sum(sampled["counts"]) <= 300_000  # counts scaled back to the tensor's size
    assert full["lo"] <= sampled["lo"] < -3 and 3 < sampled["hi"] <= full["hi"]
    share = np.array(sampled["counts"]) / sum(sampled["counts"])
    values = big.detach().numpy()
    truth = np.histogram(values, bins=16, range=(sampled["lo"], sampled["hi"]))[0] / values.size  # the same bins
    assert np.abs(share - truth).max() < 0.03  # the sample has the tensor's shape
    as_int = Histogram(torch.arange(300_000, dtype=torch.int64), num_bins=4, sample=4096).to_wire()  # the torch path
    assert as_int["sampled"] == k and 300_000 - k * RUN <= sum(as_int["counts"]) <= 300_000
    assert max(as_int["counts"]) - min(as_int["counts"]) <= 2 * k * RUN  # evenly spread over the whole tensor


def test_a_parameter_whose_histogram_keys_cannot_be_sent_is_left_out_with_one_line(tmp_path, capsys):
    import gradwatch

    model = torch.nn.Linear(4, 2)
    model.register_parameter("w" * 300, torch.nn.Parameter(torch.randn(3)))  # its key would be over 256 characters
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = gradwatch.init(project="m", server="http://127.0.0.1:9", mode="offline", spool_dir=str(tmp_path))
    run.watch(model, opt, histograms="all", system_every=None)
    for _ in range(2):
        opt.zero_grad()
        (model(torch.randn(2, 4)).sum() + model.get_parameter("w" * 300).sum()).backward()
        opt.step()
    outbound = run.recorder.sender.encoder.media
    run.finish()
    assert "no histograms of 'www" in capsys.readouterr().err
    assert outbound.put_count == 2 * 2 * 2 and not outbound.refusals  # weight and bias, grad and weight, 2 steps


def test_watch_histograms_without_numpy_go_one_by_one(tmp_path, monkeypatch):
    import sys

    import gradwatch

    model = torch.nn.Linear(4, 3).to(torch.bfloat16)  # torch can bin these without numpy (on the sender thread)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = gradwatch.init(project="m", server="http://127.0.0.1:9", mode="offline", spool_dir=str(tmp_path))
    run.watch(model, opt, histograms="all", system_every=None)
    monkeypatch.setitem(sys.modules, "numpy", None)  # a client machine with torch and no numpy
    opt.zero_grad()
    model(torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    outbound = run.recorder.sender.encoder.media
    run.finish()
    assert outbound.put_count == 4 and not outbound.refusals
