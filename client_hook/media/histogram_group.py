"""A ``watch(histograms=)`` capture as one media value: every parameter's sampled values, copied on the training
thread into one float32 matrix per sample size, binned together on the sender thread, sent as one packed group.

One value instead of one ``Histogram`` per tensor: the training thread makes a copy per tensor and hands
the sender one item, and the sender bins the matrices as they are (no stacking, no per-tensor objects).
"""

from __future__ import annotations

import sys

from gradwatch.media import histogram
from gradwatch.media.base import MediaValue


class HistogramGroup(MediaValue):
    """Histograms of many CPU tensors at one step, under ``keys`` (one row each).

    Args:
        arrays: [(key, flat numpy array)]: views of the tensors (read now, copied here).
        num_bins: bins per histogram.
        sample: bin a sample of at most this many values of a bigger array (``Histogram``'s ``sample``).
    """

    kind = "histogram"

    def __init__(self, arrays: list, num_bins: int, sample: int | None):
        self.num_bins = num_bins
        self.keys: list[str] = []
        self.scale: list[int] = []  # per row: the sample's counts times this are the tensor's
        self.blocks: list[tuple[list, object]] = []  # [(row numbers, float32 matrix of those rows)]
        self.guarded_init(self._copy, arrays, sample)

    def _copy(self, arrays: list, sample: int | None) -> None:
        np = sys.modules["numpy"]
        by_size: dict = {}
        for key, flat in arrays:
            k = 1
            if sample and flat.size > sample:
                k = -(-flat.size // sample)
                flat = histogram.sample_runs(flat, k)  # a [runs x RUN] view
            if not flat.size:
                continue
            by_size.setdefault(flat.size, []).append((len(self.keys), flat))
            self.keys.append(key)
            self.scale.append(k)
        for size, members in by_size.items():
            x = np.empty((len(members), size), dtype=np.float32)
            for row, (_i, view) in zip(x, members):
                row.reshape(view.shape)[...] = view  # the copy: the optimizer changes weights in place
            self.blocks.append(([i for i, _v in members], x))

    def estimated_bytes(self) -> int:
        return len(self.keys) * (64 + 12 * self.num_bins)

    def binned(self) -> tuple[list, object]:
        """([lo, hi, nan, +inf, -inf] per row, int64 counts [rows x bins]) (sender thread)."""
        return histogram.bin_rows(sys.modules.get("torch"), self.blocks, len(self.keys), self.num_bins)
