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
