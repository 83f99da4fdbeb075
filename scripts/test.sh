#!/usr/bin/env bash
# The whole test suite, from a fresh clone: set up, then pytest (unit, end-to-end, browser,
# wheel install, PostgreSQL), after the linters (scripts/lint.sh). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --with-browser
./scripts/lint.sh
exec .venv/bin/python -m pytest "$@"
