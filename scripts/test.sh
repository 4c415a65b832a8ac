#!/usr/bin/env bash
# Run npuops' whole test suite on a fresh machine: installs what it needs (Debian packages,
# a venv with npuops and its test tools), then lint, type-check and pytest.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NPUOPS_TEST_VENV:-.venv}
PYTHON=${PYTHON:-python3}

# Debian packages the tests drive for real (only what is missing; needs root, as CI is).
need_pkgs=()
command -v systemd-analyze >/dev/null || need_pkgs+=(systemd)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
  else
    echo "scripts/test.sh: missing Debian packages ${need_pkgs[*]}: run as root or install them" >&2
    exit 4
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test]'

"$VENV/bin/ruff" check .
"$VENV/bin/mypy"
exec "$VENV/bin/python" -m pytest "$@"
