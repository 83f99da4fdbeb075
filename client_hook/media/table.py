"""``gradwatch.Table`` (rows of cells, or a pandas DataFrame) and ``Text`` (a string logged under a key)."""

from __future__ import annotations

import json
import math
import numbers
import sys

from gradwatch.contract import encode_float
from gradwatch.media import limits
from gradwatch.media.base import MediaValue
from gradwatch.media.limits import MediaRefused


class Table(MediaValue):
    """A table to log: ``run.log({"preds": gradwatch.Table(columns=["x", "y"], data=[[1, 2]])})``.

    Args:
        columns: column names (default ``c0, c1, ...``).
        data: rows, each a list of cells (numbers, strings, bools, None; anything else becomes its text).
        rows: the same as ``data`` (W&B's other name).
        dataframe: a pandas DataFrame instead of ``columns``/``data``.

    Over ``limits.MAX_TABLE_ROWS`` rows or ``MAX_TABLE_BYTES`` of cells the table is not kept (one
    warning line, a counted gap).
    """

    kind = "table"

    def __init__(self, columns=None, data=None, rows=None, dataframe=None, **_ignored):
        self.columns: list[str] = []
        self.data: list[list] = []
        self._size = 0  # the cells' rough JSON size, for the step budget
        self.guarded_init(self._capture, columns, data if data is not None else rows, dataframe)

    def _capture(self, columns, data, dataframe) -> None:
        if dataframe is None and data is not None and hasattr(data, "columns") and hasattr(data, "itertuples"):
            dataframe, data = data, None
        if dataframe is not None:
            _check_rows(len(dataframe))
            columns = [str(c) for c in dataframe.columns]
            data = [list(row) for row in dataframe.itertuples(index=False, name=None)]
        elif data is not None:
            _check_rows(len(data))
        rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in (data or [])]
        width = max([len(columns or [])] + [len(r) for r in rows])
        self.columns = [str(c) for c in (columns or [])] + [f"c{i}" for i in range(len(columns or []), width)]
        self.data = [[_cell(v) for v in r] + [None] * (width - len(r)) for r in rows]
        self._size = sum(len(c) + 3 if isinstance(c, str) else 8 for r in self.data for c in r)

    def add_data(self, *cells) -> None:
        """Append one row (W&B's ``table.add_data``)."""
        if len(self.data) >= limits.MAX_TABLE_ROWS:
            self.refused = f"more than {limits.MAX_TABLE_ROWS:,} rows"
            return
        self.data.append([_cell(v) for v in cells])
        self._size += sum(len(c) + 3 if isinstance(c, str) else 8 for c in self.data[-1])

    def estimated_bytes(self) -> int:
        return 64 + self._size

    def to_wire(self, resolved: dict | None = None) -> dict:
        """{"columns": [...], "rows": [[...]]} with non-finite floats as the contract's strings."""
        if self.refused:
            raise MediaRefused(self.refused)
        out = {"columns": self.columns, "rows": self.data}
        size = len(json.dumps(out, allow_nan=False))
        if size > limits.MAX_TABLE_BYTES:
            raise MediaRefused(f"table of {size:,} bytes is over the limit of {limits.MAX_TABLE_BYTES:,}")
        return out


class Text(MediaValue):
    """A string logged under a key (``run.log({"sample": "once upon a time"})``)."""

    kind = "text"

    def __init__(self, text):
        self.text = str(text)
        if len(self.text) > limits.MAX_TEXT_CHARS:
            self.refused = f"text of {len(self.text):,} characters is over the limit of {limits.MAX_TEXT_CHARS:,}"

    def estimated_bytes(self) -> int:
        return 64 + len(self.text)

    def to_wire(self, resolved: dict | None = None) -> dict:
        if self.refused:
            raise MediaRefused(self.refused)
        return {"text": self.text}


def _check_rows(n: int) -> None:
    if n > limits.MAX_TABLE_ROWS:
        raise MediaRefused(f"table of {n:,} rows is over the limit of {limits.MAX_TABLE_ROWS:,}")


def _cell(value):
    """A cell as JSON: numbers (non-finite as the contract's strings), text, bools, None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else encode_float(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1:
        return _cell(value.item())
    return str(value)[:1000]
