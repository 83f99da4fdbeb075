"""The layout rules of docs/architecture.md, checked: no import cycles, no reaching into another
module's private names, packages small enough to read, the client free of server imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"gradwatch": ROOT / "client_hook", "gradwatch_server": ROOT / "server"}
MAX_MODULES_PER_FOLDER = 15


def product_modules() -> dict[str, Path]:
    """Every product module by its dotted name (a package by its __init__)."""
    found = {}
    for top, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "migrations" in path.parts:
                continue  # Alembic revisions are loaded by Alembic, not imported
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Product modules this one imports, at module level or inside functions alike."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                if f"{mod}.{alias.name}" in known:
                    out.add(f"{mod}.{alias.name}")
                elif mod in known:
                    out.add(mod)
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, result, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                result.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def graph() -> dict[str, set[str]]:
    mods = product_modules()
    known = set(mods)
    # A package's __init__ only re-exports; importing a sibling through it is not a cycle of design.
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_no_import_cycles():
    found = cycles(graph())
    assert found == [], f"import cycles: {found}"


def test_the_client_never_imports_the_server():
    for name, deps in graph().items():
        if name.startswith("gradwatch.") or name == "gradwatch":
            assert not [d for d in deps if d.startswith("gradwatch_server")], name


def private_reaches(path: Path) -> list[str]:
    """``x._name`` where x is not self/cls, and ``from m import _name``: reaches into another's privates."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            found += [
                f"{path.name}:{node.lineno} import {a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


# Private names of other libraries that have no public equivalent, each with its reason.
ALLOWED = {
    # SQLAlchemy documents Row._mapping as public API (the underscore avoids clashing with column names).
    "gradwatch_server.storage.ranks": {"._mapping"},
    # torch._foreach_norm: one fused kernel for every layer's norm (torch.linalg has no foreach form);
    # Variable._execution_engine.queue_callback: the only hook that runs once a whole backward pass ends.
    "gradwatch.capture.norms": {"._foreach_norm", "._execution_engine"},
    # The c10d store of the default process group: how ranks share the run group without a collective.
    "gradwatch.integrations.distributed": {"._get_default_store"},
    # Lightning keeps the values of self.log() for the current step only in its result collection.
    "gradwatch.integrations.lightning": {"._forward_cache", "._computed", "._forked_name", "._get_cache"},
}


def test_no_module_reaches_into_another_modules_private_names():
    reaches = []
    for name, path in product_modules().items():
        reaches += [r for r in private_reaches(path) if r.split(" ", 1)[1] not in ALLOWED.get(name, ())]
    assert reaches == []


# argparse has no public way to list a parser's sub-commands and their flags (the settings test walks them).
TESTS_ALLOWED = {"test_settings.py": {"._group_actions", "._subparsers"}}


def test_tests_use_public_seams():
    reaches = []
    for path in (ROOT / "tests").glob("*.py"):
        allowed = TESTS_ALLOWED.get(path.name, set())
        reaches += [r for r in private_reaches(path) if r.split(" ", 1)[1] not in allowed]
    assert reaches == []


MAP_START, MAP_END = "<!-- module-map:start -->", "<!-- module-map:end -->"


def module_map() -> str:
    """The module table of docs/architecture.md: every product module and the first line of its docstring."""
    rows = ["| Module | What it is for |", "|---|---|"]
    for name, path in sorted(product_modules().items()):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = doc.split("\n\n")[0].replace("\n", " ").strip()
        rows.append(f"| `{name}` | {first} |")
    return "\n".join(rows)


def test_docs_architecture_lists_every_module():
    """docs/architecture.md's module map is generated from the code (run this file with --write to refresh it)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    current = text.split(MAP_START, 1)[1].split(MAP_END, 1)[0].strip()
    assert current == module_map(), (
        "docs/architecture.md module map is stale: python tests/test_architecture.py --write"
    )


def test_every_module_says_what_it_is_for():
    assert [n for n, p in product_modules().items() if not ast.get_docstring(ast.parse(p.read_text()))] == []


def test_every_package_is_in_the_wheel():
    """A sub-package missing from pyproject's list installs from a checkout but not from the wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for top, folder in PACKAGES.items():
        for init in folder.rglob("__init__.py"):
            parts = [top, *init.parent.relative_to(folder).parts]
            assert ".".join(parts) in listed, f"{'.'.join(parts)} is not in pyproject.toml [tool.setuptools] packages"


def test_folders_stay_small():
    for folder in [*PACKAGES.values(), *(p for f in PACKAGES.values() for p in f.rglob("*") if p.is_dir())]:
        if "migrations" in folder.parts or folder.name == "__pycache__":
            continue
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= MAX_MODULES_PER_FOLDER, (folder, len(modules))


# -- the metric-key vocabulary: gradwatch.contract.keys spells every key; nothing else does ---------------------
VOCABULARY = ROOT / "client_hook" / "contract"


def key_prefixes() -> tuple[str, ...]:
    """The families' prefixes (``grad/``, ``perf/``, ``system/``...): a string that starts with one is a key."""
    from gradwatch.contract import keys

    return tuple(keys.FAMILIES.values())


def python_strings(path: Path):
    """(line, text) of every string constant in a module, docstrings aside (they may name keys)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def js_strings(path: Path):
    """(line, text) of what follows each quote in a page's code or markup, comments aside."""
    import re

    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith(("//", "*", "/*")):
            continue
        code = line.split(" // ", 1)[0]
        for m in re.finditer(r"[\"'`]([^\"'`]*)", code):
            yield n, m.group(1)


SOURCES = {"server": (".py",), "client_hook": (".py",), "frontend": (".js", ".html")}


def key_literals() -> list[str]:
    """Every metric-key literal in server/, frontend/ and client_hook/ outside the vocabulary."""
    prefixes, found = key_prefixes(), []
    folders = {"server": python_strings, "client_hook": python_strings, "frontend": js_strings}
    for folder, strings in folders.items():
        for path in sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in SOURCES[folder]):
            if VOCABULARY in path.parents or "migrations" in path.parts:
                continue
            found += [f"{path.relative_to(ROOT)}:{n}: {t!r}" for n, t in strings(path) if t.startswith(prefixes)]
    return found


def test_no_metric_key_literal_outside_the_vocabulary():
    assert key_literals() == [], "spell keys as gradwatch.contract.keys names (pages: KEYS from /contract.js)"


def test_the_key_literal_check_finds_a_literal(tmp_path):
    (tmp_path / "m.py").write_text('"""Doc naming perf/step_time."""\nKEY = "perf/step_time"\n')
    (tmp_path / "p.js").write_text('// "grad/x" in a comment\nconst k = "grad/global_norm"; // "lr/0"\n')
    assert [t for _, t in python_strings(tmp_path / "m.py") if t.startswith(key_prefixes())] == ["perf/step_time"]
    assert [t for _, t in js_strings(tmp_path / "p.js") if t.startswith(key_prefixes())] == ["grad/global_norm"]


if __name__ == "__main__":
    import sys

    if "--write" in sys.argv:
        path = ROOT / "docs" / "architecture.md"
        text = path.read_text()
        head, rest = text.split(MAP_START, 1)
        tail = rest.split(MAP_END, 1)[1]
        path.write_text(f"{head}{MAP_START}\n{module_map()}\n{MAP_END}{tail}")
