#!/usr/bin/env bash
# The main job on an embedded default, on a fresh machine: create a venv, install npuops,
# and show what it sees of this node (on a machine without NPUs it says so and why).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NPUOPS_DEMO_VENV:-.venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e .

echo "== npuops node"
"$VENV/bin/npuops" node
