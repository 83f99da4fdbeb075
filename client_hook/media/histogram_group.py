"""A ``watch(histograms=)`` capture as one media value: every parameter's histogram at one step, binned a matrix
at a time and sent as one packed group.

CPU float tensors are copied on the training thread (a sample of a big one) into one float32 matrix per
sample shape and binned together on the sender thread, in numpy. Device tensors (and CPU ones numpy
cannot read, like bfloat16) are stacked the same way on their device and binned there by one set of
kernels per matrix (``bin_rows_tensor``: no host-device sync), the result read by the sender thread with
the other deferred values. One value instead of one ``Histogram`` per tensor: one item for the sender,
a few numpy calls or kernels per capture instead of some per tensor.
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
    """

    kind = "histogram"

    def __init__(self, tensors: list, num_bins: int, sample: int | None):
        self.num_bins = num_bins
        self.keys: list[str] = []
        self.scale: list[int] = []  # per row: the sample's counts times this are the tensor's
        self.blocks: list[tuple[list, object]] = []  # host: [(row numbers, float32 matrix of those rows)]
        self.on_device: list[tuple[list, values.Deferred]] = []  # [(row numbers, their binned rows, deferred)]
        self.guarded_init(self._capture, tensors, sample)

    def _capture(self, tensors: list, sample: int | None) -> None:
        torch, np = sys.modules["torch"], sys.modules["numpy"]
        host_floats = (torch.float32, torch.float64, torch.float16)
        host: dict = {}
        device: dict = {}
        for key, tensor in tensors:
            size = tensor.numel()
            if not size or tensor.is_complex():
                continue
            k = -(-size // sample) if sample and size > sample else 1
            if tensor.device.type == "cpu" and tensor.dtype in host_floats:
                flat = tensor.numpy(force=True).reshape(-1)  # a view: copied below
                view = histogram.sample_runs(flat, k) if k > 1 else flat
                host.setdefault(view.shape, []).append((len(self.keys), view))
            else:
                flat = tensor.detach().reshape(-1)
                view = histogram.sample_runs(flat, k) if k > 1 else flat
                device.setdefault((tensor.device, tensor.dtype, view.shape), []).append((len(self.keys), view))
            self.keys.append(key)
            self.scale.append(k)
        for shape, members in host.items():
            x = np.empty((len(members), int(np.prod(shape))), dtype=np.float32)
            for row, (_i, view) in zip(x, members):
                row.reshape(shape)[...] = view  # the copy: the optimizer changes weights in place
            self.blocks.append(([i for i, _v in members], x))
        for members in device.values():
            x = torch.stack([view for _i, view in members]).reshape(len(members), -1)
            binned = histogram.bin_rows_tensor(torch, x, self.num_bins)
            self.on_device.append(([i for i, _v in members], values.defer_vector(binned.reshape(-1))))

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
