"""The runs filter and sort language (``where=``, ``order_by=``, ``columns=``), compiled to SQLAlchemy.

``config.lr < 1e-3 and config.optimizer == "adam" and summary.val/loss.min < 0.5 and status == "finished"``

A field is a run column (``id name project status created_at updated_at finished_at last_step``),
``config.<key>[.<key>...]`` (JSON, read with ``json_extract`` on SQLite and ``jsonb`` on PostgreSQL)
or ``summary.<metric key>.<last|min|max|count|nans|last_step|min_step|max_step>`` (the summaries table,
one outer join per metric key). Comparisons ``== != < <= > >=``, ``in [..]``, ``not in [..]``;
values are numbers (``1e-3``, ``inf``), strings in double or single quotes, ``true``/``false``;
``and``/``or``/``not`` and parentheses. A comparison is typed: ``config.lr < 1e-3`` is true only for
runs whose ``lr`` is a number below it; a run without the key matches no comparison. Every value is
a bound parameter. A problem raises ``QueryError`` with the column (1-based) it was found at.
``summary.<key>.at_min(<other key>)`` (``at_max``): a column only (summaries.attach), not a filter.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from sqlalchemy import Float, String, and_, case, cast, false, func, literal, not_, or_, true
from sqlalchemy.dialects.postgresql import JSONB

from gradwatch.contract import options
from gradwatch_server.storage import db

RUN_FIELDS = ("id", "name", "project", "status", "created_at", "updated_at", "finished_at", "last_step")
META_FIELDS = {"group": "run_group", "job_type": "job_type"}  # W&B's init(group=, job_type=), kept in runs.meta
SUMMARY_FIELDS = ("last", "min", "max", "count", "nans", "last_step", "min_step", "max_step")
MAX_LENGTH = 4000  # characters of one expression
MAX_TERMS = 200  # comparisons in one expression (and metric keys joined)

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<num>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf\b))
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,)
  | (?P<name>[A-Za-z_][A-Za-z0-9_./:\-]*)
    )""",
    re.VERBOSE,
)
_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_WORDS = {"and", "or", "not", "in", "true", "false"}


class QueryError(ValueError):
    """A bad expression: ``str()`` is one line naming the column (1-based) of the problem."""

    def __init__(self, message: str, column: int, text: str = ""):
        self.column = column
        self.param = ""  # which request parameter: where, order_by or columns (set by ``narrow``/``attach``)
        super().__init__(f"at column {column}: {message}" + (f" (in {text[:120]!r})" if text else ""))

    def __str__(self) -> str:
        return f"{self.param} {super().__str__()}".strip()


def named(param: str, fn, *args):
    try:
        return fn(*args)
    except QueryError as exc:
        exc.param = param
        raise


@dataclass(frozen=True)
class Field:
    """A field reference: kind is 'run', 'meta', 'config', 'summary' or 'user' (a run.summary key); for summary, ``key`` and ``part``."""

    kind: str
    name: str  # the run column, the config path (dotted) or the metric key
    part: str = ""  # summary field, or 'at_min:<other>' / 'at_max:<other>'
    column: int = 1

    @property
    def label(self) -> str:
        if self.kind == "run":
            return self.name
        if self.kind == "config":
            return f"config.{self.name}"
        if self.kind == "meta":
            return next(k for k, v in META_FIELDS.items() if v == self.name)
        if self.kind == "user":
            return f"summary.{self.name}"
        if self.part.startswith("at_"):
            how, other = self.part.split(":", 1)
            return f"summary.{self.name}.{how}({other})"
        return f"summary.{self.name}.{self.part}"


def _tokens(text: str) -> list[tuple[str, object, int]]:
    if len(text) > MAX_LENGTH:
        raise QueryError(f"expression longer than {MAX_LENGTH} characters", MAX_LENGTH)
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            at = pos + len(text[pos:]) - len(text[pos:].lstrip())
            raise QueryError(f"unexpected character {text[at]!r}", at + 1, text)
        kind = m.lastgroup
        value: object = m.group(kind)
        start = m.start(kind) + 1
        if kind == "num":
            value = float(value)
        elif kind == "str":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        elif kind == "name" and value in _WORDS or kind == "op" and value in "()[],":
            kind = value
        out.append((kind, value, start))
        pos = m.end()
    out.append(("end", None, len(text) + 1))
    return out


def parse_field(name: str, column: int = 1, text: str = "", arg: str | None = None) -> Field:
    """A dotted name as a field; ``arg`` is the key inside ``at_min(...)``/``at_max(...)``."""
    if name in RUN_FIELDS and arg is None:
        return Field("run", name, column=column)
    if name in META_FIELDS and arg is None:
        return Field("meta", META_FIELDS[name], column=column)
    head, _, rest = name.partition(".")
    if head == "config" and rest and arg is None:
        if any(not part for part in rest.split(".")):
            raise QueryError(f"empty part in config key {rest!r}", column, text)
        return Field("config", rest, column=column)
    if head == "summary" and rest and "." not in rest and arg is None:
        return Field("user", rest, column=column)  # run.summary's value (no dot in the key), else its last value
    if head == "summary" and "." in rest:
        key, _, part = rest.rpartition(".")
        if arg is not None and part in ("at_min", "at_max"):
            return Field("summary", key, f"{part}:{arg}", column)
        if arg is None and part in SUMMARY_FIELDS and key:
            return Field("summary", key, part, column)
        raise QueryError(
            f"{name!r}: a summary is summary.<key>.<{'|'.join(SUMMARY_FIELDS)}> or summary.<key>.at_min(<key>)",
            column,
            text,
        )
    raise QueryError(
        f"unknown field {name!r}: use config.<key>, summary.<key>.<field>, summary.<run.summary key> "
        f"or one of {', '.join((*RUN_FIELDS, *META_FIELDS))}",
        column,
        text,
    )


class _Parser:
    """Recursive descent over the tokens: or > and > not > comparison."""

    def __init__(self, text: str):
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.terms = 0

    def peek(self):
        return self.toks[self.i]

    def take(self, kind: str | None = None, what: str = ""):
        tok = self.toks[self.i]
        if kind is not None and tok[0] != kind:
            got = "the end" if tok[0] == "end" else repr(tok[1])
            raise QueryError(f"expected {what or kind}, got {got}", tok[2], self.text)
        self.i += 1
        return tok

    def expr(self):
        node = self.conj()
        while self.peek()[0] == "or":
            self.take()
            node = ("or", node, self.conj())
        return node

    def conj(self):
        node = self.neg()
        while self.peek()[0] == "and":
            self.take()
            node = ("and", node, self.neg())
        return node

    def neg(self):
        if self.peek()[0] == "not":
            self.take()
            return ("not", self.neg())
        if self.peek()[0] == "(":
            self.take()
            node = self.expr()
            self.take(")", "')'")
            return node
        return self.comparison()

    def field(self) -> Field:
        kind, name, col = self.take("name", "a field (config.<key>, summary.<key>.<field>, status, ...)")
        arg = None
        if self.peek()[0] == "(":
            self.take()
            arg = self.take("name", "a metric key")[1]
            self.take(")", "')'")
        return parse_field(name, col, self.text, arg)

    def value(self):
        kind, value, col = self.take()
        if kind in ("num", "str"):
            return value, col
        if kind in ("true", "false"):
            return kind == "true", col
        got = "the end" if kind == "end" else repr(value)
        raise QueryError(f'expected a value (number, "string", true or false), got {got}', col, self.text)

    def comparison(self):
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise QueryError(f"more than {MAX_TERMS} comparisons", self.peek()[2], self.text)
        f = self.field()
        kind, op, col = self.peek()
        if kind == "not":
            self.take()
            self.take("in", "'in' after 'not'")
            return ("not", ("in", f, self.values(), col))
        if kind == "in":
            self.take()
            return ("in", f, self.values(), col)
        if kind != "op" or op not in ("==", "!=", "<", "<=", ">", ">="):
            got = "the end" if kind == "end" else repr(op)
            raise QueryError(f"expected a comparison (== != < <= > >= in) after {f.label}, got {got}", col, self.text)
        self.take()
        value, vcol = self.value()
        if isinstance(value, bool) and op not in ("==", "!="):
            raise QueryError(f"{op} does not apply to true/false", vcol, self.text)
        return ("cmp", f, op, value, col)

    def values(self) -> list:
        kind, tok, col = self.take()
        if tok != "[":
            raise QueryError(f"expected '[' after in, got {'the end' if kind == 'end' else repr(tok)}", col, self.text)
        out = []
        while True:
            out.append(self.value()[0])
            if len(out) > MAX_TERMS:
                raise QueryError(f"more than {MAX_TERMS} values in a list", self.peek()[2], self.text)
            kind, tok, col = self.take()
            if tok == "]":
                return out
            if tok != ",":
                raise QueryError(f"expected ',' or ']' in the list, got {tok!r}", col, self.text)


def parse(text: str):
    """The syntax tree of a where expression (tuples; see ``_Parser``)."""
    p = _Parser(text)
    node = p.expr()
    kind, value, col = p.peek()
    if kind != "end":
        raise QueryError(f"unexpected {value!r} (join conditions with and/or)", col, text)
    return node


def fields_of(node) -> list[Field]:
    """Every field a tree names."""
    if node[0] in ("and", "or"):
        return fields_of(node[1]) + fields_of(node[2])
    if node[0] == "not":
        return fields_of(node[1])
    return [node[1]]


def parse_order(text: str) -> list[tuple[Field, bool]]:
    """``order_by``: comma-separated fields, each with an optional leading '-' (descending)."""
    out, pos = [], 0
    for part in text.split(","):
        stripped = part.strip()
        col = pos + len(part) - len(part.lstrip()) + 1
        pos += len(part) + 1
        desc = stripped.startswith("-")
        name = stripped[1:].strip() if desc else stripped
        if not name:
            raise QueryError("empty sort field", col, text)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./:\-]*", name):
            raise QueryError(f"bad sort field {name!r}", col, text)
        out.append((parse_field(name, col, text), desc))
    if len(out) > 8:
        raise QueryError("at most 8 sort fields", 1, text)
    return out


def parse_columns(text: str) -> list[Field]:
    """``columns``: comma-separated fields; ``summary.<key>`` alone means every figure of that key."""
    out = []
    for col, name in options.split_columns(text):  # the one split of the column grammar (gradwatch.contract)
        call = re.fullmatch(r"(.+)\((.+)\)", name)
        if call:
            out.append(parse_field(call.group(1).strip(), col, text, call.group(2).strip()))
        elif name.startswith("summary.") and name.rpartition(".")[2] not in SUMMARY_FIELDS:
            out.append(Field("summary", name[len("summary.") :], "", col))
        else:
            out.append(parse_field(name, col, text))
    if len(out) > MAX_TERMS:
        raise QueryError(f"more than {MAX_TERMS} columns", 1, text)
    return out


class Compiler:
    """Turns fields and trees into SQLAlchemy expressions over ``db.runs`` plus one summaries join per key."""

    def __init__(self, dialect: str):
        self.pg = dialect == "postgresql"
        self.joins: dict = {}  # metric key -> aliased summaries table
        self.user_joins: dict = {}  # run.summary key -> aliased run_summary table

    def summary_table(self, key: str):
        if key not in self.joins:
            if len(self.joins) >= MAX_TERMS:
                raise QueryError(f"more than {MAX_TERMS} metric keys", 1)
            self.joins[key] = db.summaries.alias(f"s{len(self.joins)}")
        return self.joins[key]

    def user_table(self, key: str):
        if key not in self.user_joins:
            if len(self.user_joins) >= MAX_TERMS:
                raise QueryError(f"more than {MAX_TERMS} summary keys", 1)
            self.user_joins[key] = db.run_summary.alias(f"u{len(self.user_joins)}")
        return self.user_joins[key]

    def _json(self, path: str, column=None):
        """(typeof, text value, number value) of a config key: the value typed, NULL when absent.

        ``column``: another JSON column (runs.meta, a run.summary value); an empty path is its whole value.
        """
        column = db.runs.c.config if column is None else column
        parts = path.split(".") if path else []
        if self.pg:
            doc = cast(column, JSONB)
            if not parts:
                typ, text = func.jsonb_typeof(doc), doc.op("#>>")(literal("{}", String))
                number = case((typ == "number", cast(text, Float)))
                return typ, case((typ == "string", text)), number, case((typ == "boolean", text == "true"))
            node = func.jsonb_extract_path(doc, *[literal(p, String) for p in parts])
            typ = func.jsonb_typeof(node)
            text = func.jsonb_extract_path_text(doc, *[literal(p, String) for p in parts])
            number = case((typ == "number", cast(text, Float)))
            return typ, case((typ == "string", text)), number, case((typ == "boolean", text == "true"))
        jpath = "$" + "".join(f'."{p.replace(chr(34), "")}"' for p in parts)
        value = func.json_extract(column, literal(jpath, String))
        typ = func.json_type(column, literal(jpath, String))
        number = case((typ.in_(["integer", "real"]), value))
        text = case((typ == "text", value))
        boolean = case((typ == "true", true()), (typ == "false", false()))
        return typ, text, number, boolean

    def field(self, f: Field, want: str = "number"):
        """The SQL expression of a field; for config keys, the form typed like ``want`` (number/text/bool)."""
        if f.kind == "run":
            return db.runs.c[f.name]
        if f.kind in ("config", "meta", "user"):
            _typ, text, number, boolean = self._json(*self._doc(f))
            if f.kind == "user":  # W&B's rule: what run.summary set, else the key's last value
                number = func.coalesce(number, self.summary_table(f.name).c.last)
            return {"number": number, "text": text, "bool": boolean}[want]
        if f.part.startswith("at_") or not f.part:
            raise QueryError(f"{f.label} can be a column, not a filter or a sort", f.column)
        return self.summary_table(f.name).c[f.part]

    def _doc(self, f: Field) -> tuple:
        """(path, JSON column) of a config, meta or run.summary field."""
        if f.kind == "meta":
            return f.name, db.runs.c.meta
        if f.kind == "user":
            return "", self.user_table(f.name).c.value
        return f.name, None

    def sort_key(self, f: Field):
        """A config key sorts numbers first (by value), then strings; others as they are."""
        if f.kind in ("config", "meta", "user"):
            return [self.field(f, "number"), self.field(f, "text")]
        return [self.field(f)]

    def compile(self, node):
        kind = node[0]
        if kind == "and":
            return and_(self.compile(node[1]), self.compile(node[2]))
        if kind == "or":
            return or_(self.compile(node[1]), self.compile(node[2]))
        if kind == "not":
            return not_(self.compile(node[1]))
        if kind == "in":
            _k, f, values, _col = node
            return or_(*[self.compare(f, "==", v) for v in values])
        _k, f, op, value, _col = node
        return self.compare(f, op, value)

    def compare(self, f: Field, op: str, value):
        """One typed comparison, never NULL (a missing value compares false, so ``not`` works)."""
        if isinstance(value, bool):
            want = "bool"
        elif isinstance(value, str):
            want = "text"
        else:
            want = "number"
        if f.kind in ("run", "summary"):
            self.field(f)  # raises for at_min fields
            numeric = f.kind == "summary" or f.name in ("id", "created_at", "updated_at", "finished_at", "last_step")
            if numeric != (want == "number"):
                need = "a number" if numeric else "a string"
                raise QueryError(f"{f.label} compares with {need}", f.column)
        expr = self.field(f, want)
        if want == "number" and math.isnan(value):
            raise QueryError("NaN compares with nothing", f.column)
        bound = literal(value, Float if want == "number" else String if want == "text" else None)
        if want == "bool":
            bound = true() if value else false()
        return func.coalesce(_OPS[op](expr, bound), false())


def narrow(conn, stmt, where: str | None, order_by: str | None):
    """A runs select filtered by ``where`` and sorted by ``order_by`` (newest first after them); QueryError."""
    if not where and not order_by:
        return stmt
    comp = Compiler(conn.dialect.name)
    clause = named("where", lambda: comp.compile(parse(where))) if where else None
    keys = []
    for f, desc in named("order_by", parse_order, order_by) if order_by else []:
        for expr in named("order_by", comp.sort_key, f):
            keys += [expr.is_(None), expr.desc() if desc else expr.asc()]  # runs without a value go last
    for key, s in (*comp.joins.items(), *comp.user_joins.items()):
        stmt = stmt.outerjoin(s, and_(s.c.run_id == db.runs.c.id, s.c.key == literal(key, String)))
    if clause is not None:
        stmt = stmt.where(clause)
    return stmt.order_by(None).order_by(*keys, db.runs.c.id.desc()) if keys else stmt
