"""The one number format (gradwatch.contract.format): its Python and its /contract.js twin agree on every value,
and it writes sweep values the way a practitioner does (1e-4, 0.01, +inf), never 1.000e-4 or Infinity."""

from __future__ import annotations

import json
import math

from test_contract import needs_node, node

from gradwatch import contract
from gradwatch.contract.format import format_number

# Values as they reach the pages: numbers, the contract's non-finite strings, None, booleans, other strings.
CASES = [1e-4, 3e-4, 1e-3, 0.003, 0.01, 0.1, 1, 1.0, 32, 0.858, 0.224, 1 / 3, 2 / 3, 1234.56789, 99999.5]
CASES += [123456.0, 1e5, 1.5e-7, -2.5e-5, -0.0, 0, 5e-324, 1.7976931348623157e308, 2.0**60, 1e15, 7.0e-4]
CASES += [0.0009765625, 12.5, -1.0, 0.30000000000000004, 6.02214076e23, "NaN", "Infinity", "-Infinity"]
CASES += [None, True, False, "adam"]


def test_the_format_writes_sweep_values_as_people_do():
    assert [format_number(v) for v in (1e-4, 3e-4, 1e-3, 0.01, 1.0, 32, 100000.0)] == [
        "1e-4",
        "3e-4",
        "0.001",
        "0.01",
        "1",
        "32",
        "100000",
    ]
    assert [format_number(v) for v in (math.inf, -math.inf, math.nan, "Infinity", "-Infinity", "NaN")] == [
        "+inf",
        "-inf",
        "NaN",
        "+inf",
        "-inf",
        "NaN",
    ]
    assert format_number(1.5e-7) == "1.5e-7" and format_number(123456.7) == "1.235e5"
    assert format_number(1 / 3) == "0.33333" and format_number(None) == "" and format_number("adam") == "adam"
    assert contract.format_number is format_number


@needs_node
def test_the_js_twin_agrees_with_python(tmp_path):
    out = node(tmp_path, contract.es_module(), f"console.log(JSON.stringify({json.dumps(CASES)}.map(M.formatNumber)));")
    assert out == [format_number(v) for v in CASES]
