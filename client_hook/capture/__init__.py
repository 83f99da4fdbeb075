"""Capture beyond the gradients: per-layer signals that precede instability and NaN provenance (``layer_signals``), step time."""
