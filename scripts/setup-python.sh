#!/usr/bin/env bash
# Creates the project-local virtualenv .venv (gitignored) with the Python tools
# the build and tests need (requirements-dev.txt: grpcio-tools, pytest, mypy, ...)
# and installs the Python SDK (sdk/python) into it in editable mode.
# Idempotent: a stamp file records a hash of the inputs (requirements-dev.txt,
# sdk/python/pyproject.toml, the Python version); when nothing changed a re-run
# does nothing and returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=".venv"
STAMP="$VENV/.casq-setup-stamp"

want="$(
  {
    "$PYTHON" -c 'import sys; print(sys.version)'
    cat requirements-dev.txt sdk/python/pyproject.toml
  } | sha256sum | cut -d' ' -f1
)"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "setup-python: $VENV is up to date"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup-python: creating $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
fi

# The SDK was once built with setuptools under the name casq (now casq-sdk,
# built by hatchling; the import name is still casq): its leftover metadata in
# src/ would make pip list a second, stale "casq" distribution.
rm -rf sdk/python/src/casq.egg-info

echo "setup-python: pip install -r requirements-dev.txt -e ./sdk/python"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  -r requirements-dev.txt -e ./sdk/python

echo "$want" > "$STAMP"
echo "setup-python: done ($("$VENV/bin/python" --version) in $VENV)"
