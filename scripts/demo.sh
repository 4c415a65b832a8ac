#!/usr/bin/env bash
# The main job on an embedded default, on a fresh machine, end to end:
#   1. a venv with npuops, and (outside the repo) a venv with the vLLM CPU engine (scripts/engine-venv.sh,
#      ~3 GB and ~1.5 min the first time);
#   2. what npuops sees of this node, and the level-1 doctor's verdict on it;
#   3. the plan for the scenario whose claims npuops tests (docs/claims.md): LLaMA2-13B-Chat on an Atlas 800T A2,
#      8 x 910B3;
#   4. a tiny model made locally (random weights, a locally trained tokenizer: no model hub needed), planned for
#      this machine's CPU, launched under npuops' supervisor with its progress, asked one question,
#      `npuops status` with the engine's live figures, and stopped.
# On a machine without NPUs every step still runs; the CPU engine stands in for vllm-ascend in step 4 (the same
# supervisor, gate, health checks and diagnosis as on an NPU node).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NPUOPS_DEMO_VENV:-.venv}
PYTHON=${PYTHON:-python3}
WORK=${NPUOPS_DEMO_WORK:-$(mktemp -d -t npuops-demo.XXXXXX)}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# Quiet: no lines from this machine's pip config (local indexes holding only some packages) and no setuptools
# box about editable installs (PYTHONWARNINGS reaches the build backend). The test tools come with
# `scripts/test.sh`, which installs them into this same venv.
pip_q() {
  PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v 'is ignored: it is neither' || true; } >&2
}
pip_q --upgrade pip
pip_q -e .
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

echo "== the vLLM CPU engine venv (scripts/engine-venv.sh)"
ENGINE_PYTHON=$(scripts/engine-venv.sh | tail -n 1)
ENGINE_BIN=$(dirname "$ENGINE_PYTHON")
# The engine venv carries npuops too (editable, this checkout): on a node, npuops lives in the serving venv.
ENGINE_NPUOPS="$ENGINE_BIN/npuops"

MODEL="$WORK/tiny-llama"
echo
echo "== a tiny Llama made here: $MODEL"
"$ENGINE_PYTHON" -m npuops.demo_model "$MODEL"

# Instance files stay in the work directory (a node uses /etc/npuops); short TMPDIR for vLLM's IPC sockets.
export NPUOPS_STATE_DIR="$WORK/state" HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$WORK/vllm-cache" VLLM_NO_USAGE_STATS=1
export TMPDIR=$(mktemp -d /tmp/npuops-demo-tmp.XXXXXX)
PORT=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
FLAGS=(--hardware cpu --dtype float32 --max-model-len 512 --input-len 256 --output-len 64 --enforce-eager
       --kv-cache-memory-bytes 268435456)

echo
echo "== npuops plan $MODEL ${FLAGS[*]}"
"$ENGINE_NPUOPS" plan "$MODEL" "${FLAGS[@]}"

echo
echo "== npuops launch --foreground: the start gate, then vLLM under the supervisor (progress below)"
"$ENGINE_NPUOPS" launch "$MODEL" "${FLAGS[@]}" --name demo --port "$PORT" --vllm "$ENGINE_BIN/vllm" \
  --foreground &
LAUNCH=$!
cleanup() {
  if kill -0 "$LAUNCH" 2>/dev/null; then "$ENGINE_NPUOPS" stop demo >/dev/null 2>&1 || kill "$LAUNCH"; fi
  wait "$LAUNCH" 2>/dev/null || true
  rm -rf "$TMPDIR"
}
trap cleanup EXIT
"$ENGINE_NPUOPS" status demo --wait 300 >/dev/null || { echo "demo: the engine did not become healthy" >&2; exit 1; }

echo
echo "== a request: POST http://127.0.0.1:$PORT/v1/completions (random weights: the text is gibberish)"
"$VENV/bin/python" - "$PORT" <<'EOF'
import json, sys, urllib.request
port = sys.argv[1]
body = json.dumps({"model": "tiny-llama", "prompt": "The NPU said", "max_tokens": 16, "temperature": 0}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                             headers={"Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(req, timeout=60))
print(f"  {answer['usage']['completion_tokens']} tokens, finish_reason={answer['choices'][0]['finish_reason']}")
EOF

echo
echo "== npuops bench demo: vLLM's own benchmark beside the plan's prediction (kept; status shows it)"
"$ENGINE_NPUOPS" bench demo --num-prompts 16

echo
echo "== npuops status demo"
"$ENGINE_NPUOPS" status demo
echo
echo "== npuops stop demo"
"$ENGINE_NPUOPS" stop demo
wait "$LAUNCH"
echo
echo "demo done; files in $WORK (npuops list: NPUOPS_STATE_DIR=$NPUOPS_STATE_DIR $ENGINE_NPUOPS list)"
echo "the tests: scripts/test.sh (adds the test tools to $VENV; --fast for the quick tier)"
