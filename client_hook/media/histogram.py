"""``gradwatch.Histogram``: a distribution of values, binned where the values live, read back in the background.

A device tensor is binned on its device with a handful of kernels and no host-device sync (the bin
range comes from ``amin``/``amax`` kept on the device; counts by ``scatter_add_``); the small
result vector is read by the sender thread with the other deferred values (``gradwatch.values``).
A CPU tensor is copied (one memory pass) and binned on the sender thread. NaN, +inf and -inf are
counted apart, never binned.
"""

from __future__ import annotations

import math
import sys

from gradwatch import values
from gradwatch.contract import wire
from gradwatch.media import limits
from gradwatch.media.base import MediaValue
from gradwatch.media.limits import MediaRefused

HEAD = 5  # lo, hi, nan, +inf, -inf before the counts in a binned vector
RUN = 64  # a sample is made of runs of this many consecutive values: 1/16 the cache lines of every k-th value


class Histogram(MediaValue):
    """A histogram to log: ``run.log({"weights": gradwatch.Histogram(tensor)})``.

    Args:
        sequence: a tensor (any device), numpy array or list of numbers.
        np_histogram: ``(counts, edges)`` as ``numpy.histogram`` returns them, instead of values.
        num_bins: bins between the smallest and largest finite value (1-512, default 64).
        sample: bin a sample of at most this many values of a bigger tensor (evenly spaced runs of 64
            consecutive values: one in every k), counts scaled back to its size (what ``watch(histograms=)`` does: a view, no copy of the rest).

    Over ``gradwatch.media.limits.MAX_HISTOGRAM_VALUES`` values, or of a dtype that is not a number,
    the histogram is not kept: one warning line and a counted gap when logged.
    """

    kind = "histogram"

    def __init__(
        self, sequence=None, np_histogram=None, num_bins: int = limits.DEFAULT_BINS, sample: int | None = None
    ):
        self.num_bins = max(1, min(int(num_bins), limits.MAX_BINS)) if isinstance(num_bins, (int, float)) else 64
        self.sample, self.scale = sample, 1
        self._binned = None  # a Deferred device vector: lo, hi, nan, inf, -inf, counts
        self._host = None  # a CPU tensor copy or a numpy array / list, binned on the sender thread
        self._given = None  # (counts, edges) from np_histogram
        self.guarded_init(self._capture, sequence, np_histogram)

    def _capture(self, sequence, np_histogram) -> None:
        if np_histogram is not None:
            counts, edges = (list(map(float, x)) for x in np_histogram)
            if len(edges) != len(counts) + 1 or not counts or len(counts) > limits.MAX_BINS:
                raise MediaRefused(f"np_histogram needs 1-{limits.MAX_BINS} counts and one edge more")
            self._given = (counts, edges)
            return
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(sequence, torch.Tensor):
            self._capture_tensor(torch, sequence)
            return
        np = sys.modules.get("numpy")
        if np is not None and isinstance(sequence, np.ndarray):
            _check_count(sequence.size)
            if sequence.dtype.kind not in "biuf":
                raise MediaRefused(f"cannot bin values of dtype {sequence.dtype}")
            self._host = np.array(sequence, dtype=np.float64).reshape(-1)  # a copy: the caller may reuse the array
            return
        data = list(sequence)
        _check_count(len(data))
        self._host = [float(v) for v in data]

    def _capture_tensor(self, torch, tensor) -> None:
        if tensor.device.type == "cpu" and tensor.dtype in (torch.float32, torch.float64, torch.float16):
            self._capture_cpu(torch, tensor)
            return
        if self.sample and tensor.numel() > self.sample:
            self.scale = -(-tensor.numel() // self.sample)
            tensor = _runs(tensor.detach().reshape(-1), self.scale)
        _check_count(tensor.numel())
        if tensor.is_complex() or not (tensor.is_floating_point() or tensor.dtype in _int_dtypes(torch)):
            raise MediaRefused(f"cannot bin values of dtype {tensor.dtype}")
        tensor = tensor.detach()
        if tensor.device.type == "cpu":
            self._host = tensor.reshape(-1).clone()  # the optimizer updates weights in place: keep these
        elif tensor.numel():
            self._binned = values.defer_vector(bin_tensor(torch, tensor, self.num_bins))
        else:
            self._host = []

    def _capture_cpu(self, torch, tensor) -> None:
        """A CPU float tensor's values (a sample of a big one) copied through a numpy view: one torch call instead
        of seven (each ~5-20 us of dispatch), the training thread's cost of ``watch(histograms=)`` (#29)."""
        flat = tensor.numpy(force=True).reshape(-1)  # a view: no grad, no copy on the CPU
        if self.sample and flat.size > self.sample:
            self.scale = -(-flat.size // self.sample)
            flat = _runs(flat, self.scale)
        _check_count(flat.size)
        self._host = torch.from_numpy(flat.copy())  # the optimizer updates weights in place: keep these

    def estimated_bytes(self) -> int:
        return 64 + 12 * self.num_bins

    def deferred(self) -> list:
        """Device vectors to read with the other deferred values (sender thread)."""
        return [self._binned] if self._binned is not None else []

    def to_wire(self, resolved: dict | None = None, packed: bool = False) -> dict:
        """{"edges" or "lo"/"hi", "counts", "nan", "inf", "ninf"}; ``resolved`` maps id(deferred) -> its binned row.

        ``packed``: counts in the packed form (``contract.wire.encode_counts``) of wire feature ``histogram_packed``.
        """
        if self.refused:
            raise MediaRefused(self.refused)
        if self._given is not None:
            counts, edges = self._given
            counts = [int(c) for c in counts]
            return {
                "edges": edges,
                "counts": wire.encode_counts(counts) if packed else counts,
                "nan": 0,
                "inf": 0,
                "ninf": 0,
            }
        if self._binned is not None:
            row = (resolved or {}).get(id(self._binned)) or values.resolve([self._binned])[0]
        else:
            row = (resolved or {}).get(id(self)) or _bin_host(self._host, self.num_bins)
        counts = row[HEAD:]
        if type(counts[0]) is not int:  # bin_many's rows hold ints already
            counts = [int(c) for c in counts]
        return wire_one(row[:HEAD], counts, self.scale, packed)


def wire_one(head: list, counts: list, k: int, packed: bool) -> dict:
    """One binned histogram's wire value from its head [lo, hi, nan, +inf, -inf] and its sample's int ``counts``,
    scaled back by ``k`` (``packed``: counts in the form of wire feature ``histogram_packed``)."""
    lo, hi, nan, inf, ninf = head
    if not math.isfinite(lo):  # nothing finite to bin
        lo, hi = 0.0, 1.0
    out = {
        "lo": lo,
        "hi": hi if hi > lo else lo + 1.0,
        "counts": wire.encode_counts(counts, k) if packed else [c * k for c in counts] if k > 1 else counts,
        "nan": int(nan) * k,
        "inf": int(inf) * k,
        "ninf": int(ninf) * k,
    }
    if k > 1:
        out["sampled"] = k
    return out


def _runs(flat, k: int):
    """``sample_runs`` as one flat tensor or array (a copy)."""
    return sample_runs(flat, k).reshape(-1)


def sample_runs(flat, k: int):
    """One run of ``RUN`` consecutive values out of every ``k * RUN`` of a flat tensor or array, as a [runs x RUN]
    view (where the input is contiguous); the tail past the last whole stretch is left out (fewer than ``k * RUN``)."""
    stretch = k * RUN
    whole = flat.shape[0] // stretch * stretch
    return flat[:whole].reshape(-1, stretch)[:, :RUN]


def _check_count(n: int) -> None:
    if n > limits.MAX_HISTOGRAM_VALUES:
        raise MediaRefused(f"{n:,} values is over the limit of {limits.MAX_HISTOGRAM_VALUES:,} per histogram")


def _int_dtypes(torch) -> tuple:
    return (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def bin_tensor(torch, tensor, bins: int):
    """[lo, hi, nan, +inf, -inf, counts...] as float64 on the tensor's device; no host-device sync."""
    x = tensor.reshape(-1)
    x = x.float() if not x.is_floating_point() or x.dtype in (torch.float16, torch.bfloat16) else x
    finite = torch.isfinite(x)
    inf = math.inf
    lo = torch.where(finite, x, inf).amin()
    hi = torch.where(finite, x, -inf).amax()
    base = torch.where(finite.any(), lo, torch.zeros_like(lo))
    width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    # Clamped to [0, bins - 1] first, truncation is floor (and ~1000x cheaper than .floor() on some CPU builds).
    scaled = ((x - base) * (bins / width)).clamp_(0, bins - 1)
    index = torch.where(finite, scaled, torch.full_like(scaled, bins)).long()  # non-finite: the slot past the last
    counts = torch.zeros(bins + 1, dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, index, torch.ones(1, dtype=torch.int64, device=x.device).expand_as(index))
    head = torch.stack(
        [lo, hi, torch.isnan(x).sum().to(x.dtype), (x == inf).sum().to(x.dtype), (x == -inf).sum().to(x.dtype)]
    )
    return torch.cat([head.to(torch.float64), counts[:bins].to(torch.float64)])


def bin_rows_tensor(torch, x, bins: int):
    """``bin_tensor`` of every row of a [rows x values] tensor at once: [rows x (HEAD + bins)] float64 on its device,
    a fixed handful of kernels for all the rows (one scatter_add_) and no host-device sync."""
    rows = x.shape[0]
    x = x.float() if not x.is_floating_point() or x.dtype in (torch.float16, torch.bfloat16) else x
    finite = torch.isfinite(x)
    inf = math.inf
    lo = torch.where(finite, x, inf).amin(1)
    hi = torch.where(finite, x, -inf).amax(1)
    base = torch.where(finite.any(1), lo, torch.zeros_like(lo))
    width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    scaled = ((x - base[:, None]) * (bins / width)[:, None]).clamp_(0, bins - 1)
    index = torch.where(finite, scaled, torch.full_like(scaled, bins)).long()  # non-finite: the slot past the last
    index += torch.arange(rows, device=x.device)[:, None] * (bins + 1)
    counts = torch.zeros(rows * (bins + 1), dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, index.reshape(-1), torch.ones(1, dtype=torch.int64, device=x.device).expand(index.numel()))
    nonfinite = [torch.isnan(x).sum(1), (x == inf).sum(1), (x == -inf).sum(1)]
    head = torch.stack([lo, hi, *(c.to(x.dtype) for c in nonfinite)], 1)
    return torch.cat([head.to(torch.float64), counts.view(rows, bins + 1)[:, :bins].to(torch.float64)], 1)


BATCHED = 65536  # CPU tensors up to this size are binned together, one [tensors x values] matrix (sender thread)


def host_tensor(part) -> object | None:
    """The CPU tensor a Histogram will bin on the sender thread, when it is small enough to bin in a batch."""
    torch = sys.modules.get("torch")
    data = getattr(part, "_host", None) if isinstance(part, Histogram) and not part.refused else None
    if torch is not None and isinstance(data, torch.Tensor) and 0 < data.numel() <= BATCHED:
        return data
    return None


def bin_many(torch, tensors: list, bins: int) -> list[list]:
    """``bin_tensor`` of many small CPU tensors at once: [lo, hi, nan, +inf, -inf, counts...] each."""
    if sys.modules.get("numpy") is None:
        return [bin_tensor(torch, t, bins).tolist() for t in tensors]
    heads, counts = bin_matrix(torch, tensors, bins)
    return [head + row for head, row in zip(heads, counts.tolist())]


def bin_matrix(torch, tensors: list, bins: int) -> tuple[list, object]:
    """([lo, hi, nan, +inf, -inf] per tensor, int64 counts [tensors x bins]) of many small CPU tensors, in numpy.

    numpy, not torch: on the CPU builds measured here torch's elementwise ops on small tensors cost
    ~20-300x numpy's, and this runs every ``every``-th step for hundreds of parameters. Tensors of one
    size (a watch() capture has two or three sizes) are one matrix (``bin_rows``).
    """
    np = sys.modules["numpy"]
    flats = [(t if t.dtype == torch.float32 else t.float()).numpy().reshape(-1) for t in tensors]
    by_size: dict = {}
    for i, flat in enumerate(flats):
        by_size.setdefault(flat.size, []).append(i)
    blocks = [(members, np.stack([flats[i] for i in members])) for members in by_size.values()]
    return bin_rows(torch, blocks, len(flats), bins)


def bin_rows(torch, blocks: list, n: int, bins: int) -> tuple[list, object]:
    """``bin_matrix`` of ``blocks``: [(row numbers, a float32 matrix of those rows' values)], ``n`` rows in all.

    Each block is binned row by row in a few numpy calls; every row's bins get one combined index
    (row * bins + bin), written into one buffer, and one ``bincount`` counts them all. A row holding
    NaN or inf (its min or max is not finite) is binned on its own (``bin_tensor``).
    """
    np = sys.modules["numpy"]
    heads: list = [None] * n
    index = np.empty(sum(x.size for _m, x in blocks), dtype=np.intp)
    used, alone = 0, []
    for members, x in blocks:
        lo, hi = x.min(1), x.max(1)  # NaN propagates: a row with NaN or inf has a non-finite min or max
        finite = np.isfinite(lo) & np.isfinite(hi)
        if not finite.all():
            alone += [(i, x[j]) for j, (i, ok) in enumerate(zip(members, finite)) if not ok]
            members, x, lo, hi = [i for i, ok in zip(members, finite) if ok], x[finite], lo[finite], hi[finite]
        if not members:
            continue
        scaled = np.subtract(x, lo[:, None], dtype=np.float32)
        scaled *= (bins / np.where(hi > lo, hi - lo, 1)).astype(np.float32)[:, None]
        np.clip(scaled, 0, bins - 1, out=scaled)  # then truncation is floor
        rows = index[used : used + scaled.size].reshape(scaled.shape)
        np.copyto(rows, scaled, casting="unsafe")
        rows += (np.asarray(members, dtype=np.intp) * bins)[:, None]  # in integers: no rounding across a bin edge
        used += scaled.size
        for i, a, b in zip(members, lo.tolist(), hi.tolist()):
            heads[i] = [a, b, 0, 0, 0]
    counts = np.bincount(index[:used], minlength=n * bins).reshape(-1, bins)
    for i, row in alone:
        binned = bin_tensor(torch, torch.from_numpy(np.ascontiguousarray(row)), bins).tolist()
        heads[i], counts[i] = binned[:HEAD], binned[HEAD:]
    return heads, counts


def wire_group(scale: list, heads: list, counts) -> dict:
    """One packed wire value for many histograms of one step (wire feature ``histogram_packed``): {"keys" (filled
    by the caller), "lo", "hi", "nan", "inf", "ninf", "scale": [one each], "counts": packed [histograms x bins]}."""
    lo, hi = [], []
    for head in heads:
        a, b = (head[0], head[1]) if math.isfinite(head[0]) else (0.0, 1.0)  # nothing finite to bin
        lo.append(a)
        hi.append(b if b > a else a + 1.0)
    return {
        "lo": lo,
        "hi": hi,
        **{name: [int(h[i]) * k for h, k in zip(heads, scale)] for i, name in ((2, "nan"), (3, "inf"), (4, "ninf"))},
        "scale": scale,
        "counts": wire.encode_count_array(counts),
    }


def _bin_host(data, bins: int) -> list:
    """The same binning for a CPU tensor, a numpy array or a list (sender thread)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        return bin_tensor(torch, data, bins).tolist() if data.numel() else [math.inf, -math.inf, 0, 0, 0] + [0] * bins
    np = sys.modules.get("numpy")
    if np is not None and isinstance(data, np.ndarray):
        return _bin_numpy(np, data, bins)
    finite = [v for v in data if math.isfinite(v)]
    nan = sum(1 for v in data if math.isnan(v))
    inf, ninf = sum(1 for v in data if v == math.inf), sum(1 for v in data if v == -math.inf)
    lo, hi = (min(finite), max(finite)) if finite else (math.inf, -math.inf)
    counts = [0] * bins
    width = (hi - lo) if finite and hi > lo else 1.0
    for v in finite:
        counts[min(bins - 1, max(0, int((v - lo) * bins / width)))] += 1
    return [lo, hi, nan, inf, ninf, *counts]


def _bin_numpy(np, data, bins: int) -> list:
    finite = np.isfinite(data)
    good = data[finite]
    nan, inf, ninf = int(np.isnan(data).sum()), int((data == np.inf).sum()), int((data == -np.inf).sum())
    if not good.size:
        return [math.inf, -math.inf, nan, inf, ninf] + [0] * bins
    lo, hi = float(good.min()), float(good.max())
    width = hi - lo if hi > lo else 1.0
    index = np.clip(np.floor((good - lo) * (bins / width)), 0, bins - 1).astype(np.int64)
    return [lo, hi, nan, inf, ninf, *np.bincount(index, minlength=bins).tolist()]
