"""A project's rules document: validated, stored with who changed what and when, and turned into what a run's
Monitor applies (threshold overrides, rules turned off, severities, custom rules).

The document::

    {"disabled": ["loss_spike"], "thresholds": {"loss_spike.factor": 8}, "severity": {"loss_spike": "critical"},
     "custom": [{"name": "val loss high", "key": "val/loss", "type": "threshold", "op": ">", "value": 2.0}]}

Thresholds (patience and cooldown included) are the names of the rules' specs (``gradwatch.contract.rules``). A run's own
``init(alerts=...)`` (and the server's ``--alerts``) win over the project's thresholds.
"""

from __future__ import annotations

import json
import time

from sqlalchemy import select

from gradwatch import contract
from gradwatch.contract import rules as th_rules
from gradwatch_server.health import registry
from gradwatch_server.rules.custom import OPS, TYPES, CustomRule, run_custom
from gradwatch_server.storage import db

EMPTY = {"disabled": [], "thresholds": {}, "severity": {}, "custom": []}
MAX_CUSTOM = 50
# Steps of state all of a project's custom rules keep (window, or m for n_of_m, per rule): what one batch of
# the project may cost the writer, whatever the rules (docs/security.md, "Limits").
RULES_BUDGET = 100_000
# What GET .../rules answers besides the document: sent back to PUT or .../backtest, ignored (not a 400).
READ_ONLY = frozenset({"by", "updated_at", "updated_by", "history", "defaults", "kinds", "project"})
_NEEDS = {"threshold": ("value",), "relative": ("factor",), "zscore": ("z",), "n_of_m": ("value", "n", "m")}


def _number(where: str, value, low: float = -float("inf")) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value <= low:
        raise ValueError(f"{where} must be a number{'' if low == -float('inf') else f' above {low:g}'}, got {value!r}")
    return float(value)


def check_custom(i: int, rule) -> dict:
    """One custom rule, normalised, or ValueError naming what is wrong."""
    where = f"custom[{i}]"
    if not isinstance(rule, dict):
        raise ValueError(f"{where} must be an object")
    name, key, kind = rule.get("name"), rule.get("key"), rule.get("type")
    if not isinstance(name, str) or not 0 < len(name) <= contract.MAX_KEY_LEN:
        raise ValueError(f"{where}.name must be a non-empty string")
    if not isinstance(key, str) or not 0 < len(key) <= contract.MAX_KEY_LEN:
        raise ValueError(f"{where}.key must be a metric key")
    if kind not in TYPES:
        raise ValueError(f"{where}.type must be one of {', '.join(TYPES)}, got {kind!r}")
    out = {"name": name, "key": key, "type": kind, "op": rule.get("op", ">")}
    if out["op"] not in OPS:
        raise ValueError(f"{where}.op must be '>' or '<'")
    for field in _NEEDS[kind]:
        if field not in rule:
            raise ValueError(f"{where}: a {kind} rule needs {field!r}")
        out[field] = _number(
            f"{where}.{field}", rule[field], 0 if field in ("factor", "z", "n", "m") else -float("inf")
        )
    for field, default, low in (("window", 50, 1), ("cooldown", 20, 0), ("min_history", 10, 1)):
        value = _number(f"{where}.{field}", rule.get(field, default), low - 1)
        out[field] = min(int(value), th_rules.MAX_WINDOW)
    if kind == "n_of_m" and (out["n"] != int(out["n"]) or out["m"] != int(out["m"]) or out["n"] > out["m"]):
        raise ValueError(f"{where}: n and m must be whole numbers with n <= m")
    if kind == "n_of_m":
        out["n"], out["m"] = int(out["n"]), min(int(out["m"]), 10000)
    out["severity"] = rule.get("severity", "warning")
    if out["severity"] not in contract.SEVERITIES:
        raise ValueError(f"{where}.severity must be one of {', '.join(contract.SEVERITIES)}")
    return out


def validate(doc) -> dict:
    """The rules document normalised, or ValueError saying what is wrong (the first problem)."""
    if not isinstance(doc, dict):
        raise ValueError("rules must be an object")
    unknown = set(doc) - set(EMPTY) - READ_ONLY
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}; known: {sorted(EMPTY)}")
    kinds = set(registry.kinds())
    disabled = doc.get("disabled", [])
    if not isinstance(disabled, list) or any(k not in kinds for k in disabled):
        raise ValueError(f"disabled must be a list of rule kinds: {', '.join(sorted(kinds))}")
    thresholds = doc.get("thresholds", {})
    if not isinstance(thresholds, dict):
        raise ValueError("thresholds must be an object of name -> number")
    checked = {name: th_rules.check(name, value) for name, value in thresholds.items()}
    severity = doc.get("severity", {})
    if not isinstance(severity, dict) or any(
        k not in kinds or v not in contract.SEVERITIES for k, v in severity.items()
    ):
        raise ValueError(f"severity must map rule kinds to one of {', '.join(contract.SEVERITIES)}")
    custom = doc.get("custom", [])
    if not isinstance(custom, list) or len(custom) > MAX_CUSTOM:
        raise ValueError(f"custom must be a list of at most {MAX_CUSTOM} rules")
    rules = [check_custom(i, r) for i, r in enumerate(custom)]
    names = [r["name"] for r in rules]
    if len(set(names)) != len(names):
        raise ValueError("custom rule names must be unique")
    cost = sum(cost_of(r) for r in rules)
    if cost > RULES_BUDGET:
        raise ValueError(
            f"custom rules over the project's rules budget: their windows (m for n_of_m) add up to {cost:,} "
            f"steps, the budget is {RULES_BUDGET:,} (fewer rules or smaller windows)"
        )
    return {"disabled": sorted(set(disabled)), "thresholds": checked, "severity": dict(severity), "custom": rules}


def cost_of(rule: dict) -> int:
    """Steps of state one custom rule keeps (what the rules budget counts)."""
    return {"threshold": 1, "n_of_m": rule.get("m", 1)}.get(rule["type"], rule["window"])


class Policy:
    """What a Monitor applies from a project's rules: turned-off kinds, severities, custom rules (with state)."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.disabled = set(doc["disabled"])
        self.severity = doc["severity"]
        self.custom = [CustomRule(spec) for spec in doc["custom"]]
        self.keys = {spec["key"] for spec in doc["custom"]}

    def reads(self, key: str) -> bool:
        return key in self.keys

    def apply(self, alerts: list) -> list:
        """Drop the kinds turned off; set the project's severity on the rest."""
        out = []
        for a in alerts:
            if a.kind in self.disabled:
                continue
            if a.kind in self.severity:
                a.severity = self.severity[a.kind]
            out.append(a)
        return out

    def run_custom(self, steps, scalars) -> list:
        return run_custom(self.custom, steps, scalars)


def load(conn, project: str) -> dict:
    """The project's rules document (the empty one when never edited), with when and by whom."""
    row = conn.execute(select(db.project_rules).where(db.project_rules.c.project == project)).first()
    if row is None:
        return {**EMPTY, "updated_at": None, "updated_by": None}
    return {**json.loads(row.rules), "updated_at": row.updated_at, "updated_by": row.updated_by}


def changes(before: dict, after: dict) -> list[str]:
    """What changed, one line each: ``thresholds.loss_spike.factor: 10 -> 8``."""
    out = []
    for part in ("disabled", "thresholds", "severity"):
        if part == "disabled":
            for k in sorted(set(before[part]) ^ set(after[part])):
                out.append(f"{k}: {'off' if k in after[part] else 'on'}")
            continue
        for k in sorted(set(before[part]) | set(after[part])):
            if before[part].get(k) != after[part].get(k):
                out.append(f"{part}.{k}: {before[part].get(k, 'default')} -> {after[part].get(k, 'default')}")
    old = {r["name"]: r for r in before["custom"]}
    new = {r["name"]: r for r in after["custom"]}
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            out.append(
                f"custom {name!r}: {'added' if name not in old else 'removed' if name not in new else 'changed'}"
            )
    return out


def save(conn, project: str, doc: dict, by: str | None, now: float | None = None) -> dict:
    """Store a validated document and a log line of what changed; returns the stored document."""
    now = now or time.time()
    before = load(conn, project)
    diff = changes({k: before[k] for k in EMPTY}, doc)
    values = {"rules": json.dumps(doc), "updated_at": now, "updated_by": by}
    if before["updated_at"] is None:
        conn.execute(db.project_rules.insert().values(project=project, **values))
    else:
        conn.execute(db.project_rules.update().where(db.project_rules.c.project == project).values(**values))
    if diff:
        conn.execute(db.rules_log.insert().values(project=project, at=now, by=by, changes=json.dumps(diff)))
    return {**doc, "updated_at": now, "updated_by": by}


def history(conn, project: str, limit: int = 50) -> list[dict]:
    """Who changed the project's rules, what and when, newest first."""
    rows = conn.execute(
        select(db.rules_log).where(db.rules_log.c.project == project).order_by(db.rules_log.c.id.desc()).limit(limit)
    )
    return [{"at": r.at, "by": r.by, "changes": json.loads(r.changes)} for r in rows]


def for_run(conn, project: str, run_config: dict) -> tuple[dict, Policy | None]:
    """(thresholds, policy) for a run of the project: the project's thresholds under the run's own."""
    doc = load(conn, project)
    if doc["updated_at"] is None:
        return run_config, None
    return {**doc["thresholds"], **run_config}, Policy({k: doc[k] for k in EMPTY})


def project_runs(conn, project: str) -> list[int]:
    return [r.id for r in conn.execute(select(db.runs.c.id).where(db.runs.c.project == project))]
