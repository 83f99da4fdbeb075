"""Decimal detection for float64 blocks (ALP's idea, Afroozeh et al., SIGMOD 2023), bit-exact.

A float64 that was born a decimal (0.1034 typed or printed, a timer rounded to microseconds, a rate to
four significant digits) is ``k / 10**e`` for a small integer ``k``: storing ``k`` (as deltas,
zigzagged, byte-shuffled) takes a byte or two where its 52 noisy-looking mantissa bits took six.
A block qualifies only when every value comes back bit for bit from the integers (so -0.0, NaN, inf
and any value that is not such a decimal leave the block to the float transforms).
"""

from __future__ import annotations

import numpy as np

MAX_EXPONENT = 22  # 10**e exact in float64 up to 22
MAX_FACTOR = 18  # trailing decimal zeros taken off the integers (1234000 -> 1234, factor 3)
_LIMIT = 2.0**52  # integers beyond this no longer round-trip through float64 division
_POWERS = np.array([10.0**e for e in range(MAX_EXPONENT + 1)])  # as ``10.0**e`` gives them, bit for bit


def find(values: np.ndarray) -> tuple[int, int, np.ndarray] | None:
    """(exponent, factor, integers as uint64 bits) with ``restore`` giving ``values`` back exactly, or None."""
    if values.size == 0 or not np.isfinite(values).all():
        return None
    sample = values.ravel()[:: max(1, values.size // 16)]  # most blocks fail on a few values, cheaply
    with np.errstate(all="ignore"):
        for exponent in _tried(sample):
            scaled = np.rint(values * _POWERS[exponent])
            if np.abs(scaled).max() >= _LIMIT:
                return None
            ints = scaled.astype("<i8")
            if (restore(ints, exponent, 0).view("<i8") == values.view("<i8")).all():  # -0.0 fails here
                factor = 0
                while factor < MAX_FACTOR and (ints % 10 == 0).all() and ints.any():
                    ints, factor = ints // 10, factor + 1
                return exponent, factor, ints.view("<u8")
    return None


def _tried(sample: np.ndarray) -> list[int]:
    """The exponents, smallest first, at which the sample is decimal, up to the first where its integers
    outgrow float64's exact range (so would every larger one's): every exponent tried in one numpy pass,
    the same ones trying them in order would pick (one by one they cost ~30 us each, most blocks failing)."""
    scaled = np.rint(sample[None, :] * _POWERS[:, None])
    over = np.flatnonzero(np.abs(scaled).max(axis=1) >= _LIMIT)
    upto = int(over[0]) if len(over) else len(_POWERS)
    back = scaled[:upto].astype("<i8").astype("<f8") / _POWERS[:upto, None]  # restore's arithmetic, every row
    fits = (back.view("<i8") == sample.view("<i8")[None, :]).all(axis=1)
    return np.flatnonzero(fits).tolist()


def restore(ints: np.ndarray, exponent: int, factor: int) -> np.ndarray:
    """``find``'s integers back as the float64 values they came from."""
    return _divide((ints * 10**factor).astype("<f8"), exponent)


def _divide(scaled: np.ndarray, exponent: int) -> np.ndarray:
    return scaled / _POWERS[exponent]
