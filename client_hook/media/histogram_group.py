"""A ``watch(histograms=)`` capture as one media value: every parameter's histogram at one step, binned a matrix
at a time and sent as one packed group.

CPU tensors are copied on the training thread (a sample of a big one) into one float32 matrix per sample
shape and binned together on the sender thread, in numpy. Device tensors are stacked the same way on
their device and binned there by one set of kernels per matrix (``bin_rows_tensor``: no host-device
sync), the result read by the sender thread with the other deferred values. One value instead of one
``Histogram`` per tensor: one item for the sender, a few numpy calls or kernels per capture, not per tensor.
"""

from __future__ import annotations

import sys

from gradwatch import values
from gradwatch.media import histogram
from gradwatch.media.base import MediaValue


class HistogramGroup(MediaValue):
    """Histograms of many tensors at one step, under ``keys`` (one row each, in the order given).

    Args:
        tensors: [(key, tensor)]: read now (copied or stacked here), never kept.
        num_bins: bins per histogram.
        sample: bin a sample of at most this many values of a bigger tensor (``Histogram``'s ``sample``).
        on_device: True: every tensor binned by torch ops where it lives, CPU ones too (what a GPU's do; the
            tests' way to run that path on a CPU); default: device tensors there, CPU ones on the sender thread.
    """

    kind = "histogram"

    def __init__(self, tensors: list, num_bins: int, sample: int | None, on_device: bool | None = None):
        self.num_bins = num_bins
        self.keys: list[str] = []
        self.scale: list[int] = []  # per row: the sample's counts times this are the tensor's
        self.blocks: list[tuple[list, object]] = []  # host: [(row numbers, float32 matrix of those rows)]
        self.on_device: list[tuple[list, values.Deferred]] = []  # [(row numbers, their binned rows, deferred)]
        self.guarded_init(self._capture, tensors, sample, on_device)

    def _capture(self, tensors: list, sample: int | None, on_device: bool | None) -> None:
        torch = sys.modules["torch"]
        with torch.no_grad():  # views of parameters and the device binning: nothing for autograd to record
            self._copy(torch, tensors, sample, on_device)

    def _copy(self, torch, tensors: list, sample: int | None, on_device: bool | None) -> None:
        np = sys.modules["numpy"]
        host_floats = (torch.float32, torch.float64, torch.float16)
        arrays: dict = {}  # sample shape -> [(row, numpy view)]
        views: dict = {}  # (device, dtype, sample shape) -> [(row, tensor view)]
        for key, tensor in tensors:
            size = tensor.numel()
            if not size or tensor.is_complex():
                continue
            k = -(-size // sample) if sample and size > sample else 1
            if tensor.device.type == "cpu" and tensor.dtype in host_floats and not on_device:
                flat = tensor.numpy(force=True).reshape(-1)  # a view: copied below
                view = histogram.sample_runs(flat, k) if k > 1 else flat
                arrays.setdefault(view.shape, []).append((len(self.keys), view))
            else:
                view = _view(tensor, k)
                views.setdefault((tensor.device, tensor.dtype, view.shape), []).append((len(self.keys), view))
            self.keys.append(key)
            self.scale.append(k)
        for shape, members in arrays.items():
            x = np.empty((len(members), int(np.prod(shape))), dtype=np.float32)
            for row, (_i, view) in zip(x, members):
                row.reshape(shape)[...] = view  # the copy: the optimizer changes weights in place
            self.blocks.append(([i for i, _v in members], x))
        for (device, _dtype, _shape), members in views.items():
            x = torch.stack([view for _i, view in members]).reshape(len(members), -1)
            rows = [i for i, _v in members]
            if device.type == "cpu" and not on_device:  # bfloat16, integers: as float32, binned with the rest
                self.blocks.append((rows, x.to(torch.float32).numpy()))
                continue
            binned = histogram.bin_rows_tensor(torch, x, self.num_bins)
            self.on_device.append((rows, values.defer_vector(binned.reshape(-1))))

    @property
    def count(self) -> int:
        return len(self.keys)

    def estimated_bytes(self) -> int:
        return len(self.keys) * (64 + 12 * self.num_bins)

    def deferred(self) -> list:
        """The device results to read with the other deferred values (sender thread)."""
        return [d for _rows, d in self.on_device]

    def binned(self, resolved: dict | None = None) -> tuple[list, object]:
        """([lo, hi, nan, +inf, -inf] per row, int64 counts [rows x bins]) (sender thread); ``resolved`` maps
        id(deferred) -> its values, as ``Histogram.to_wire`` takes them."""
        np = sys.modules["numpy"]
        n, bins = len(self.keys), self.num_bins
        heads, counts = histogram.bin_rows(sys.modules.get("torch"), self.blocks, n, bins)
        for rows, deferred in self.on_device:
            flat = (resolved or {}).get(id(deferred)) or values.resolve([deferred])[0]
            got = np.asarray(flat, dtype=np.float64).reshape(len(rows), histogram.HEAD + bins)
            counts[rows] = got[:, histogram.HEAD :].astype(np.int64)
            for i, head in zip(rows, got[:, : histogram.HEAD].tolist()):
                heads[i] = head
        return heads, counts


def _view(tensor, k: int):
    """What to bin of a tensor numpy cannot view (under no_grad), as a view: its sample (``histogram.sample_runs``) or all of it, flat; one
    ``as_strided`` for a contiguous one (~2 us a tensor against ~9 us for the four view ops, times hundreds)."""
    if not tensor.is_contiguous():
        flat = tensor.reshape(-1)
        return histogram.sample_runs(flat, k) if k > 1 else flat
    if k == 1:
        return tensor.view(-1)
    stretch = k * histogram.RUN
    return tensor.as_strided((tensor.numel() // stretch, histogram.RUN), (stretch, 1))
