#!/usr/bin/env bash
# Run npuops' whole test suite on a fresh machine: installs what it needs (Debian packages, a venv
# with npuops and its test tools, the vLLM CPU engine venv for the end-to-end tests), then lint,
# type-check and pytest. CI runs exactly this (.ci/run).
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NPUOPS_TEST_VENV:-.venv}
PYTHON=${PYTHON:-python3}

# Debian packages the tests drive for real (only what is missing; needs root, as CI is).
need_pkgs=()
command -v systemd-analyze >/dev/null || need_pkgs+=(systemd)
command -v bash >/dev/null || need_pkgs+=(bash)
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

# The real vLLM engine (CPU build) for the end-to-end tests, in its own venv outside the repo.
# NPUOPS_REQUIRE_ENGINE=1 turns a missing engine into a test error, so these tests cannot silently skip.
if [ -z "${NPUOPS_ENGINE_PYTHON:-}" ]; then
  NPUOPS_ENGINE_PYTHON=$(scripts/engine-venv.sh | tail -n 1)
fi
export NPUOPS_ENGINE_PYTHON NPUOPS_REQUIRE_ENGINE=${NPUOPS_REQUIRE_ENGINE:-1}

"$VENV/bin/ruff" check .
"$VENV/bin/mypy"
exec "$VENV/bin/python" -m pytest "$@"
