"""``import gradwatch`` stays light: no server packages, no torch until watch()."""

import subprocess
import sys


def test_import_does_not_pull_server_or_torch():
    code = (
        "import sys, gradwatch; bad = [m for m in ('fastapi', 'sqlalchemy', 'plotly', 'uvicorn', 'torch', "
        "'gradwatch_server') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_surface_is_small():
    import gradwatch

    for name in ("init", "watch", "log", "finish", "Run", "TrainingDiverged"):
        assert hasattr(gradwatch, name)
    assert callable(gradwatch.flush)


def test_the_integrations_keep_their_old_names():
    """``gradwatch.lightning`` & co. are the modules of ``gradwatch.integrations``, loaded only when imported."""
    code = (
        "import sys, gradwatch; light = 'gradwatch.integrations.lightning' in sys.modules; "
        "import gradwatch.lr_range as a, gradwatch.integrations.lr_range as b; "
        "from gradwatch import distributed; import gradwatch.integrations.distributed as d; "
        "print(light, a is b, distributed is d, gradwatch.lr_find.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "True", "gradwatch"]


def _key_literals(path) -> list[str]:
    """String constants (docstrings aside) and f-string heads in ``path`` that spell a metric key."""
    import ast

    from gradwatch.contract import keys

    tree = ast.parse(path.read_text())
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    prefixes = tuple(keys.FAMILIES.values())
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            text = str(node.values[0].value)
        if text is not None and text.startswith(prefixes):
            found.append(f"{path.name}:{node.lineno} {text!r}")
    return found


def test_the_client_spells_metric_keys_only_in_the_vocabulary():
    from pathlib import Path

    client = Path(__file__).resolve().parent.parent / "client_hook"
    found = [hit for p in sorted(client.rglob("*.py")) if "contract" not in p.parts for hit in _key_literals(p)]
    assert found == []
