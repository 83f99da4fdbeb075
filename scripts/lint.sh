#!/usr/bin/env bash
# Linters and formatters, as CI runs them: ruff (Python, configured in pyproject.toml) and Biome
# (JavaScript and CSS in frontend/, pinned in package.json, configured in biome.json).
# --fix rewrites the tree instead of checking it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/ruff ] || .venv/bin/python -m pip install -q "ruff==0.17.6"
[ -x node_modules/.bin/biome ] || npm ci --silent --no-audit --no-fund
if [ "${1:-}" = "--fix" ]; then
  .venv/bin/ruff check --fix . && .venv/bin/ruff format .
  node_modules/.bin/biome check --write .
else
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  node_modules/.bin/biome ci --colors=off --error-on-warnings .
fi
