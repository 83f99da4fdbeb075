"""Option lists the server, the CLI and the pages share, and the runs-table column grammar (one parser).

Severities, custom-rule types and comparisons, the compare page's aggregations and bands, export
formats. A runs-table column is ``<run field>``, ``config.<dotted path>``, ``summary.<key>.<figure>``
or ``summary.<key>.at_min(<other key>)`` (``at_max``); a list of them is comma separated, commas
inside the parentheses of ``at_min(...)`` not splitting. ``split_columns`` and ``parse_column`` are
written here in Python and JavaScript (/contract.js ``splitColumns``/``parseColumn``), side by side.
Standard library only: the client imports it.
"""

from __future__ import annotations

import re

SEVERITIES = ("info", "warning", "critical")
CUSTOM_RULE_TYPES = ("threshold", "relative", "zscore", "n_of_m")  # a project's own rules (server/rules/custom.py)
CUSTOM_RULE_OPS = (">", "<")
AGGREGATIONS = ("mean", "median")  # a group's line on the compare page
BANDS = ("std", "sem", "minmax", "none")  # the band around it: std, standard error, min-max, none
TIME_AXES = ("step", "wall", "relative")  # x axes that are not a metric key (any scalar key is one too)
EXPORT_FORMATS = ("csv", "parquet", "json")  # gradwatch export --format

# One column of a comma-separated list: a name, with a parenthesised argument kept whole.
_COLUMN = re.compile(r"[^,()]+(?:\([^)]*\))?")
_AT = re.compile(r"summary\.(.+)\.(at_min|at_max)\((.+)\)")


def split_columns(text: str | None) -> list[tuple[int, str]]:
    """The columns of a ``columns=`` list as (1-based character where it starts, name stripped)."""
    out = []
    for m in _COLUMN.finditer(text or ""):
        name = m.group(0).strip()
        if name:
            out.append((m.start() + 1, name))
    return out


def column_names(text: str | None) -> list[str]:
    """The names of a ``columns=`` list, as given."""
    return [name for _, name in split_columns(text)]


def parse_column(name: str) -> tuple[str, ...]:
    """A column name as (kind, path...): ("config", "a.b"), ("summary", key, figure) or ("run", field).

    The figure of ``summary.loss.at_min(lr)`` is ``"at_min(lr)"``.
    """
    if name.startswith("config."):
        return ("config", name[len("config.") :])
    at = _AT.fullmatch(name)
    if at:
        return ("summary", at.group(1), f"{at.group(2)}({at.group(3)})")
    if name.startswith("summary."):
        key, dot, figure = name[len("summary.") :].rpartition(".")
        return ("summary", key, figure) if dot else ("summary", figure, "")
    return ("run", name)


# The JavaScript twins of split_columns (names only) and parse_column.
JS = r"""
export function splitColumns(text) {
  return (
    (text || "")
      .match(/[^,()]+(?:\([^)]*\))?/g)
      ?.map((s) => s.trim())
      .filter(Boolean) ?? []
  );
}
const AT_COLUMN = /^summary\.(.+)\.(at_min|at_max)\((.+)\)$/;
export function parseColumn(name) {
  if (name.startsWith("config.")) return ["config", name.slice(7)];
  const at = AT_COLUMN.exec(name);
  if (at) return ["summary", at[1], `${at[2]}(${at[3]})`];
  if (name.startsWith("summary.")) {
    const rest = name.slice(8),
      i = rest.lastIndexOf(".");
    return i < 0 ? ["summary", rest, ""] : ["summary", rest.slice(0, i), rest.slice(i + 1)];
  }
  return ["run", name];
}
"""


def shared() -> dict:
    """The option lists /contract.js carries, by JavaScript name."""
    return {
        "SEVERITIES": list(SEVERITIES),
        "CUSTOM_RULE_TYPES": list(CUSTOM_RULE_TYPES),
        "CUSTOM_RULE_OPS": list(CUSTOM_RULE_OPS),
        "AGGREGATIONS": list(AGGREGATIONS),
        "BANDS": list(BANDS),
        "TIME_AXES": list(TIME_AXES),
        "EXPORT_FORMATS": list(EXPORT_FORMATS),
    }
