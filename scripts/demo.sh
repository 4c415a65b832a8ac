#!/usr/bin/env bash
# The main job on an embedded default, on a fresh machine: create a venv, install npuops, show what
# it sees of this node, run the level-1 doctor, then plan the embedded default model (the
# LLaMA2-13B-Chat scenario of npuops' founding document on an Atlas 800T A2, 8 x 910B3) and render
# its launch files. On a machine without NPUs every step still runs and says what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NPUOPS_DEMO_VENV:-.venv}
PYTHON=${PYTHON:-python3}
OUT=${NPUOPS_DEMO_OUT:-$(mktemp -d -t npuops-demo.XXXXXX)}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e .
NPUOPS="$VENV/bin/npuops"

echo "== npuops node"
"$NPUOPS" node
echo
echo "== npuops doctor --level 1   (exit 1 here is the verdict on this node, not a demo failure)"
"$NPUOPS" doctor --level 1 || true
echo
echo "== npuops plan llama-2-13b-chat --hardware 910B3x8 --input-len 512 --output-len 128"
"$NPUOPS" plan llama-2-13b-chat --hardware 910B3x8 --input-len 512 --output-len 128
echo
echo "== npuops launch --dry-run: the files for Qwen3-8B (config only) on 910B3x8, one instance per replica"
"$NPUOPS" launch tests/fixtures/models/qwen3-8b --hardware 910B3x8 --name qwen3-8b --dry-run --output "$OUT"
echo
echo "== the first replica's systemd unit ($OUT/qwen3-8b-r0/npuops-qwen3-8b-r0.service)"
cat "$OUT/qwen3-8b-r0/npuops-qwen3-8b-r0.service"
