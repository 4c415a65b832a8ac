#!/usr/bin/env bash
# Run npuops' whole test suite on a fresh machine: installs what it needs (Debian packages, a venv
# with npuops and its test tools, the vLLM CPU engine venv for the end-to-end tests), then lint,
# type-check and pytest. CI runs exactly this (.ci/run).
# Usage: scripts/test.sh [--fast] [pytest args...]
#   --fast  the inner loop: the tests not marked slow (no systemd boots, fleets of test hosts, playbook runs or
#           engines serving), under 3 minutes once the venvs exist.
# Environment: NPUOPS_TEST_WORKERS (pytest-xdist workers, default 2: this machine's cores; 0 runs in one
# process), NPUOPS_TEST_DURATIONS=FILE (write each test's seconds there; tests/durations.json orders the runs).
set -euo pipefail
cd "$(dirname "$0")/.."

tier=()
if [ "${1:-}" = "--fast" ]; then
  shift
  tier=(-m "not slow")
fi

VENV=${NPUOPS_TEST_VENV:-.venv}
PYTHON=${PYTHON:-python3}

# Debian packages the tests drive for real (only what is missing; needs root, as CI is).
need_pkgs=()
# systemd: systemd-analyze, and the systemd the lifecycle tests boot as PID 1 in a namespace (tests/systemd).
command -v systemd-analyze >/dev/null || need_pkgs+=(systemd)
command -v pgrep >/dev/null || need_pkgs+=(procps)
command -v bash >/dev/null || need_pkgs+=(bash)
# Provisioning tests: vendor-style .run installers are built with makeself; fleet tests run sshd test hosts in
# network namespaces (iproute2) and Ansible needs a system python3 on them.
command -v makeself >/dev/null || need_pkgs+=(makeself)
[ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
command -v ip >/dev/null || need_pkgs+=(iproute2)
[ -x /usr/bin/python3 ] || need_pkgs+=(python3)
# `npuops monitor render`'s configuration and rules are checked and unit-tested with promtool (Debian's prometheus).
command -v promtool >/dev/null || need_pkgs+=(prometheus)
# ... and run for real against a routed instance, with node_exporter serving the doctor's textfile.
[ -x /usr/bin/prometheus-node-exporter ] || need_pkgs+=(prometheus-node-exporter)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    # Packages must not start services here (openssh-server would start an sshd on this machine's port 22):
    # policy-rc.d exit 101 tells invoke-rc.d "not now", for the time of this install only.
    guard=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      guard=/usr/sbin/policy-rc.d
      printf '#!/bin/sh\nexit 101\n' >"$guard" && chmod 755 "$guard"
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
    [ -z "$guard" ] || rm -f "$guard"
  else
    echo "scripts/test.sh: missing Debian packages ${need_pkgs[*]}: run as root or install them" >&2
    exit 4
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'

# The real vLLM engine (CPU build) for the end-to-end tests, in its own venv outside the repo.
# NPUOPS_REQUIRE_ENGINE=1 turns a missing engine into a test error, so these tests cannot silently skip; the
# same for the sshd test hosts of the fleet tests (NPUOPS_REQUIRE_FLEET=1).
export NPUOPS_REQUIRE_FLEET=${NPUOPS_REQUIRE_FLEET:-1}
# promtool (Debian's prometheus, installed above) checks and unit-tests the monitoring rules.
export NPUOPS_REQUIRE_PROMTOOL=${NPUOPS_REQUIRE_PROMTOOL:-1}
# ... and for real systemd booted as PID 1 in a namespace (tests/systemd, the --allow-reboot provisioning test).
export NPUOPS_REQUIRE_SYSTEMD=${NPUOPS_REQUIRE_SYSTEMD:-1}
if [ -z "${NPUOPS_ENGINE_PYTHON:-}" ]; then
  NPUOPS_ENGINE_PYTHON=$(scripts/engine-venv.sh | tail -n 1)
fi
export NPUOPS_ENGINE_PYTHON NPUOPS_REQUIRE_ENGINE=${NPUOPS_REQUIRE_ENGINE:-1}

"$VENV/bin/ruff" check .
"$VENV/bin/mypy"
# The layers (pyproject.toml [tool.importlinter]): nothing imports upward, only the CLI knows click.
"$VENV/bin/lint-imports"
# No function over 80 lines, no module over 600 (npuops/, checks/).
"$VENV/bin/python" scripts/size_rule.py
# Two workers (pytest-xdist): the tests that share an engine, a booted systemd or a module's launch go to one worker
# as a group, the longest groups first (tests/support/scheduling.py). The slowest tests and the time by group are
# listed at the end: CI must stay under 35 minutes.
workers=${NPUOPS_TEST_WORKERS:-2}
xdist=()
[ "$workers" = 0 ] || xdist=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
exec "$VENV/bin/python" -m pytest "${xdist[@]}" --durations=15 "${tier[@]}" "$@"
