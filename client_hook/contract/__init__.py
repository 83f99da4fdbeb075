"""The facts the training hook, the server and the pages share, each written once.

Run statuses, alert kinds and severities, size limits, which keys are losses, and how non-finite
floats travel ("NaN", "Infinity", "-Infinity": strict JSON has no NaN). Python imports them from
here (``gradwatch.protocol`` re-exports the codec); the pages import the same values from
``/contract.js``, which the server serves from ``es_module()`` below, so a page can never disagree
with the server. The two rules pages need as code (loss keys, the float codec) are written here in
both languages, side by side; tests/test_contract.py runs the JavaScript under node against the
Python. Standard library only: the client imports it.
"""

from __future__ import annotations

import json
import math
from typing import Any

# -- run statuses -------------------------------------------------------------------------------
STATUSES = ("running", "stalled", "finished", "failed", "crashed")
ACTIVE_STATUSES = ("running", "stalled")  # a training job may still be writing to the run
ENDED_STATUSES = frozenset({"finished", "failed", "crashed"})
CLIENT_STATUSES = ("running", "finished", "failed")  # what a client's status event may say
CLIENT_ENDINGS = ("finished", "failed")  # a client ends its own run with one of these

# -- alert kinds --------------------------------------------------------------------------------
# The health rules' kinds; missing_gradients also comes from the client (parameters left out of the
# optimizer) and memory_pressure from a client's OOM crash.
RULE_KINDS = (
    "nan_loss",
    "loss_spike",
    "loss_divergence",
    "nonfinite_gradients",
    "exploding_gradients",
    "vanishing_gradients",
    "zero_gradients",
    "missing_gradients",
    "memory_pressure",
    "amp_overflow",
    "loss_plateau",
    "instability_warning",
    "throughput_drop",
)
# raised by the server about the data itself; custom_rule: a project's own rule on any metric (server/rules/)
SERVER_KINDS = ("data_gap", "data_refused", "stalled", "custom_rule", "straggler")
# sent by the client as alert events (nan_provenance: where the first NaN/inf was born, capture/layer_signals.py)
CLIENT_KINDS = ("missing_gradients", "data_gap", "lr_suggestion", "nan_provenance")
ALERT_KINDS = tuple(dict.fromkeys(RULE_KINDS + SERVER_KINDS + CLIENT_KINDS))  # every kind an alert can have
SEVERITIES = ("info", "warning", "critical")

# -- limits -------------------------------------------------------------------------------------
MAX_KEY_LEN = 256  # characters in a metric key, a layer (slot) name or an alert key
# characters in a run or project name: a hello cuts a longer one (never refuse a training job over a
# name), an edit by a person is refused with the reason
MAX_NAME_LEN = 200
MAX_STEP = (1 << 63) - 1  # steps are stored as signed 64-bit integers
OUTBOX_MEMORY_BYTES = 32 << 20  # default memory for unacked batches before the client spools to disk
MAX_KEYS_PER_RUN = 10000  # default: most distinct metric keys one run may create
MAX_LAYERS = 100000  # default: most slots (layers) in one per-layer vector key
# What one client may make the server hold or do (docs/security.md lists each and what happens past it).
MAX_DOC_BYTES = 1 << 20  # a run's config or meta, as JSON: a bigger hello is refused
MAX_DOC_DEPTH = 32  # nesting of a run's config or meta (a deeper hello is refused)
MAX_TAGS = 100  # tags on one run (a hello or an edit with more is refused)
MAX_TAG_LEN = 64  # characters in one tag
MAX_ALERT_EVENTS_PER_BATCH = 100  # client alert events one batch may raise; the rest are refused
LINK_MIN_GAP = 0.04  # seconds: an idle client link sends a batch at most this often (25 frames a second)
LINK_MAX_GAP = 1.0  # seconds: the longest gap a server's ack may ask a link to leave between batches
MAX_ALERTS_PER_RUN = 1000  # distinct alerts one run may hold; new ones past it are refused (recurrences count on)

NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class ProtocolError(ValueError):
    """A message that does not follow the protocol."""


def is_loss_key(key: str) -> bool:
    """Keys whose last path part mentions 'loss' are the ones watched for NaN/inf and spikes."""
    return "loss" in key.rsplit("/", 1)[-1].lower()


# "The loss" of a run (runs list column, sparkline, last/best loss on compare): the key the run
# declared (``init(loss_key=...)``, set by the integrations), else the first of these it logged.
LOSS_KEYS = ("loss", "train_loss", "train/loss", "loss/train", "training_loss", "train_loss_step", "train_loss_epoch")


def main_loss_key(keys, declared: str | None = None) -> str | None:
    """The run's loss: ``declared`` when it logged it, else the first usual name it logged, else None."""
    keys = set(keys)
    if declared and declared in keys:
        return declared
    return next((k for k in LOSS_KEYS if k in keys), None)


def encode_float(value: float | None) -> float | str | None:
    """Turn a float into a JSON-safe value, non-finite floats into strings."""
    if value is None:
        return None
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def decode_float(value: Any) -> float | None:
    """Inverse of ``encode_float``; raises ProtocolError on anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ProtocolError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in NONFINITE:
        return NONFINITE[value]
    raise ProtocolError(f"expected a number or 'NaN'/'Infinity'/'-Infinity', got {value!r}")


def encode_floats(values) -> list:
    """``encode_float`` over a list (None, "no value", stays None)."""
    return [encode_float(v) for v in values]


def decode_floats(values) -> list:
    """``decode_float`` over a list (None stays None)."""
    return [decode_float(v) for v in values]


def shared_constants() -> dict:
    """The constants the pages get from /contract.js, by their JavaScript names."""
    return {
        "STATUSES": list(STATUSES),
        "ACTIVE_STATUSES": list(ACTIVE_STATUSES),
        "ENDED_STATUSES": [s for s in STATUSES if s in ENDED_STATUSES],
        "ALERT_KINDS": list(ALERT_KINDS),
        "SEVERITIES": list(SEVERITIES),
        "MAX_KEY_LEN": MAX_KEY_LEN,
        "LOSS_KEYS": list(LOSS_KEYS),
    }


# The JavaScript twins of is_loss_key, decode_float and encode_float. The pages trust the server,
# so decodeFloat passes anything it does not know through unchanged instead of raising.
_JS_FUNCTIONS = """
export const isLossKey = (key) => key.split("/").pop().toLowerCase().includes("loss");
export function mainLossKey(keys, declared) {
  const have = new Set(keys);
  if (declared && have.has(declared)) return declared;
  return LOSS_KEYS.find((k) => have.has(k)) ?? null;
}
export const decodeFloat = (v) => (NONFINITE.has(v) ? NONFINITE.get(v) : v);
export function encodeFloat(v) {
  if (typeof v !== "number" || isFinite(v)) return v;
  for (const [text, x] of NONFINITE) if (Object.is(x, v)) return text;
}
"""
_JS_FLOATS = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}  # NONFINITE's values as JS


def es_module() -> str:
    """The ES module served as /contract.js (and inlined into ``gradwatch report``)."""
    lines = ["// Generated by the gradwatch server from gradwatch/contract.py: change it there, not here."]
    lines += [f"export const {name} = {json.dumps(value)};" for name, value in shared_constants().items()]
    pairs = ", ".join(f"[{json.dumps(text)}, {_JS_FLOATS[text]}]" for text in NONFINITE)
    lines.append(f"const NONFINITE = new Map([{pairs}]);")
    return "\n".join(lines) + "\n" + _JS_FUNCTIONS.lstrip("\n")
