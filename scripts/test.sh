#!/usr/bin/env bash
# The test suite, from a fresh clone: set up, the linters (scripts/lint.sh), then pytest.
#   ./scripts/test.sh          the whole suite: unit, server and process, browser (Chromium), slow
#                              (wheel install, PostgreSQL); the README's and CI's command
#   ./scripts/test.sh --fast   the unit tests alone (in-process, no server, no Chromium set-up),
#                              a couple of minutes
# The lanes are pytest marks set by tests/conftest.py. Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fast" ]; then
  shift
  ./scripts/setup.sh
  ./scripts/lint.sh
  exec .venv/bin/python -m pytest -m "not server and not browser and not slow" "$@"
fi
./scripts/setup.sh --with-browser
./scripts/lint.sh
exec .venv/bin/python -m pytest "$@"
