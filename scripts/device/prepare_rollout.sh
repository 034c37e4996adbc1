#!/bin/bash
# Stage what scripts/device/gpu_rollout.py needs on a lent GPU machine in the git-ignored folder
# .gpu (about 24 MiB: it travels with `carry: [".gpu"]`): the wheels that machine lacks (faiss-cpu,
# bm25s, PyStemmer: ragrl imports them) and SmolLM2's tokenizer (no weights: the script builds
# random weights of each shape there).
# usage: scripts/device/prepare_rollout.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
E=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$E")"
grep -q '^/.gpu/' "$E" 2>/dev/null || printf '/.gpu/\n' >> "$E"
rm -rf .gpu && mkdir -p .gpu/whl .gpu/smollm2
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux1_x86_64 -d .gpu/whl faiss-cpu==1.15.1 bm25s==0.3.16 PyStemmer==3.1.0
P=$(.venv/bin/python -c "from ragrl.models.lm_weights import resolve_policy; print(resolve_policy('smollm2-135m-instruct'))")
for f in tokenizer.json tokenizer_config.json chat_template.jinja config.json generation_config.json; do
  [ -f "$P/$f" ] && cp "$P/$f" .gpu/smollm2/
done
.venv/bin/python scripts/device/gpu_rollout.py --dry-run --out /tmp/gpu_rollout_dry.json   # known to work here first
du -sh .gpu
