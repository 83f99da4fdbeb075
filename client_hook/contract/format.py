"""One number format for every page, the CLI and the report: ``1e-4``, ``0.01``, ``1``, ``32``, ``+inf``.

Short and exact enough to tell sweep values apart: five significant digits in plain notation from 1e-3 to
1e5, four in a compact exponent outside it (``3e-4``, ``1.235e6``, never ``1.000e-4`` or ``1e-04``),
integers whole, and the non-finite values as ``NaN``, ``+inf``, ``-inf`` (also when they arrive in the
contract's string form). ``format_number`` is written here in Python and JavaScript (/contract.js
``formatNumber``), side by side; tests/test_contract.py runs both on the same values.
Standard library only: the client imports it.
"""

from __future__ import annotations

import math

from gradwatch.contract.wire import NONFINITE

PLAIN_FROM, PLAIN_TO = 1e-3, 1e5  # plain notation inside [PLAIN_FROM, PLAIN_TO), exponent notation outside
WHOLE_BELOW = 1e15  # integers below this are written out in full


def format_number(value) -> str:
    """``value`` as the pages show it; None is ``""``, a string other than NaN/±inf is returned as is."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if value not in NONFINITE:
            return value
        value = NONFINITE[value]
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+inf" if v > 0 else "-inf"
    a = abs(v)
    if v.is_integer() and a < WHOLE_BELOW:
        return str(int(v))
    if a >= PLAIN_TO or a < PLAIN_FROM:
        mantissa, exponent = f"{v:.3e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    r = float(f"{v:.5g}")
    return str(int(r)) if r.is_integer() else repr(r)


# The JavaScript twin of format_number (decodeFloat is in the same generated module).
JS = f"""
export function formatNumber(value) {{
  if (value === null || value === undefined) return "";
  if (typeof value === "boolean") return String(value);
  const v = typeof value === "string" ? decodeFloat(value) : value;
  if (typeof v !== "number") return String(v);
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "+inf" : "-inf";
  const a = Math.abs(v);
  if (Number.isInteger(v) && a < {WHOLE_BELOW:.0e}) return String(v);
  if (a >= {PLAIN_TO:.0e} || a < {PLAIN_FROM:.0e}) {{
    const [mantissa, exponent] = v.toExponential(3).split("e");
    return mantissa.replace(/\\.?0+$/, "") + "e" + Number(exponent);
  }}
  return String(Number(v.toPrecision(5)));
}}
"""
