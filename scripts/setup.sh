#!/usr/bin/env bash
# Idempotent set-up of everything the project and its tests need, on a fresh machine:
# a virtualenv in .venv with the CPU build of torch, gradwatch (editable) with its server and
# test extras, and Debian's Chromium for the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# Pinned on purpose: an unpinned torch makes pip fetch a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
# setuptools prints a 10-line "Editable installation" banner as a warning of its build step, which
# -q does not silence: warnings are off for this one command only.
PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -e ".[server,test]"
if [ "${1:-}" = "--with-browser" ] && ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
fi
