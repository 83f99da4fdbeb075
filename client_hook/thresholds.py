"""Health-rule thresholds, kept importable as ``gradwatch.thresholds``: they live in gradwatch.contract.rules.

Each rule's ``RuleSpec`` owns its thresholds (defaults and ranges); the client checks
``init(alerts=...)`` with ``validate`` so a typo fails at once, in the user's script.
"""

from __future__ import annotations

from gradwatch.contract.rules import DEFAULTS, MAX_WINDOW, check, merged, of, validate

__all__ = ["DEFAULTS", "MAX_WINDOW", "check", "merged", "of", "validate"]
