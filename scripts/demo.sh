#!/usr/bin/env bash
# Install, start the server on the embedded SQLite default, and stream real demo training runs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/gradwatch demo "$@"
