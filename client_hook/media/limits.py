"""Size caps on media values: what one value, one step and one run may carry (the server's defaults read these too)."""

from __future__ import annotations

MAX_HISTOGRAM_VALUES = 10_000_000  # values binned per histogram; more is refused (binning 1e8 would stall a step)
DEFAULT_BINS = 64
MAX_BINS = 512
MAX_IMAGE_RAW_BYTES = 32 << 20  # pixels before encoding (a 4096 x 2048 RGBA image)
MAX_IMAGE_BYTES = 2_500_000  # one encoded PNG (its base64 must fit the 4 MiB frame a batch travels in)
MAX_IMAGES_PER_VALUE = 64  # a list of images under one key at one step
MAX_TABLE_ROWS = 10_000
MAX_TABLE_BYTES = 2 << 20  # one table's cells, encoded as JSON
MAX_TEXT_CHARS = 100_000
MAX_STEP_BYTES = 8 << 20  # every media value of one step together
MAX_RUN_BYTES = 1 << 30  # every media value of a run (the server has its own cap: settings media_max_run_bytes)


class MediaRefused(ValueError):
    """A media value that is not kept: over a cap, of a type or dtype it cannot be, or unreadable."""
