#!/bin/bash
# Stage what a lent GPU machine needs for an MMOA run (scripts/device/README.md), in two git-ignored
# folders that each fit one call's 64 MiB: .dev1 (wheels the machine lacks, the corpus, the first
# 45 MiB of SmolLM2's GGUF) and .dev2 (the rest of the GGUF, the start adapter, the run script).
# usage: scripts/device/prepare.sh START_ADAPTER_DIR
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
START=${1:?usage: $0 START_ADAPTER_DIR}
E=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$E")"
grep -q '^/.dev1/' "$E" 2>/dev/null || printf '/.dev1/\n/.dev2/\n' >> "$E"
G=$(.venv/bin/python -c "from ragrl.models.policy import smollm2_gguf_path; print(smollm2_gguf_path())")
KIT=$(.venv/bin/python -c "from ragrl.paths import data_kit; print(data_kit())")
rm -rf .dev1 .dev2 && mkdir -p .dev1/whl .dev1/data/corpus .dev2
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
  -d .dev1/whl gguf==0.19.0 bm25s==0.3.16 PyStemmer==3.1.0
head -c 47185920 "$G" > .dev1/part_a && tail -c +47185921 "$G" > .dev2/part_b
cp "$KIT/corpus/wiki_passages.jsonl.gz" .dev1/data/corpus/
cp scripts/device/stage1.sh scripts/device/wsum.py .dev1/ && cp scripts/device/run_mmoa.sh .dev2/
cp -r "$START" .dev2/s5
.venv/bin/python scripts/device/wsum.py "$(.venv/bin/python -c "from ragrl.models.policy import resolve_policy; print(resolve_policy('smollm2-135m-instruct'))")"
du -sh .dev1 .dev2
