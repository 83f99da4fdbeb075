"""The health rules in the order they run: every place that lists rules reads them from here.

The Monitor (record by record), the batch path (numpy), the alert kinds, the scalar keys ingest
hands to the rules, how a recurring alert keeps its worst value and the tables in docs/alerts.md
all iterate ``RULES``, so a declared rule runs everywhere and none can be left out of one list.

Adding a rule: its ``RuleSpec`` (kind, severity, thresholds named ``<kind>.<setting>``, doc) in
gradwatch.contract.rules (client_hook/contract/rules.py), and a ``Rule`` (rule.py) with its checks in a
rule module's ``RULES`` tuple; a new rule module also goes into ``MODULES``. Tests and plug-ins can
``register`` a rule at run time, passing its spec as ``Rule(..., own_spec=RuleSpec(...))``.
"""

from __future__ import annotations

from gradwatch.contract import rules as specs
from gradwatch.contract.keys import is_loss_key
from gradwatch_server.health import early_warning, grads, layers, loss, stuck, system
from gradwatch_server.health.pace import throughput
from gradwatch_server.health.rule import Rule

# Their rules run in this order, which is the order of the alerts several rules raise on one record.
MODULES = (loss, grads, layers, system, stuck, early_warning, throughput)

RULES: tuple[Rule, ...] = ()
_reads: frozenset = frozenset()  # the scalar keys some rule reads
_losses = False  # whether some rule reads the losses


def register(rule: Rule) -> Rule:
    """Add a rule after the registered ones; from then on every Monitor runs it, per record and per batch.

    Args:
        rule: the rule; its ``name`` (state key) and ``kind`` must not be taken.

    Returns:
        The rule, so a module can write ``MY_RULE = register(Rule(...))``.
    """
    global RULES
    if not isinstance(rule, Rule):
        raise TypeError(f"expected a Rule, got {type(rule).__name__}")
    if not callable(rule.check) or not callable(rule.bulk):
        raise TypeError(f"rule {rule.name!r} needs a per-record check and a bulk check")
    for other in RULES:
        if rule.name == other.name or rule.kind == other.kind:
            raise ValueError(f"rule {rule.name!r} ({rule.kind}) clashes with registered {other.name!r} ({other.kind})")
    if rule.own_spec is not None:
        if rule.own_spec.kind != rule.kind:
            raise ValueError(f"rule {rule.name!r} raises {rule.kind!r} but its spec is {rule.own_spec.kind!r}'s")
        specs.declare(rule.own_spec)  # its thresholds and kind are known everywhere from now on
    RULES = (*RULES, rule)
    _index()
    return rule


def unregister(name: str) -> Rule:
    """Remove the rule with this state name.

    Args:
        name: the rule's ``name``.

    Returns:
        The rule removed (KeyError when there is none).
    """
    global RULES
    found = [r for r in RULES if r.name == name]
    if not found:
        raise KeyError(name)
    RULES = tuple(r for r in RULES if r.name != name)
    if found[0].own_spec is not None:
        specs.withdraw(found[0].kind)
    _index()
    return found[0]


def _index() -> None:
    """Recompute what ``relevant`` reads: it runs for every key of every batch."""
    global _reads, _losses
    _reads = frozenset().union(*(r.reads for r in RULES))
    _losses = any(r.losses for r in RULES)


def kinds() -> tuple[str, ...]:
    """The alert kinds the registered rules raise, in rule order."""
    return tuple(r.kind for r in RULES)


def reads() -> frozenset:
    """The scalar keys some registered rule reads (besides the losses)."""
    return _reads


def by_kind(kind: str) -> Rule | None:
    """The rule that raises this kind, or None (a kind from the client or the server itself)."""
    return next((r for r in RULES if r.kind == kind), None)


def relevant(key: str) -> bool:
    """Whether any rule reads this scalar key (ingest hands the rules only these)."""
    return key in _reads or (_losses and is_loss_key(key))


def smaller_is_worse(kind: str) -> bool:
    """Whether, for this alert kind, a smaller |value| is the worse one."""
    rule = by_kind(kind)
    return rule is not None and rule.smaller_is_worse


def nonfinite_kinds() -> tuple[str, ...]:
    """The kinds whose alert value may be NaN/inf on purpose (the value is the news)."""
    return tuple(r.kind for r in RULES if r.nonfinite_value)


def rules_table() -> str:
    """The markdown table of the rules for docs/alerts.md: kind and what it detects."""
    lines = ["| kind | what it detects |", "|---|---|"]
    lines += [f"| `{r.kind}` | {r.doc} |" for r in RULES]
    return "\n".join(lines)


def thresholds_table() -> str:
    """The markdown table of every rule's thresholds and their defaults for docs/alerts.md."""
    lines = ["| name | default |", "|---|---|"]
    lines += [f"| `{name}` | {value:g} |" for r in RULES for name, value in r.thresholds.items()]
    return "\n".join(lines)


for _module in MODULES:
    for _rule in _module.RULES:
        register(_rule)
