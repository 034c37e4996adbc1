#!/bin/bash
# Stage issue #53's GPU run (scripts/device/README.md, "The Search-R1 learn variant at a paper-like
# batch") in two git-ignored folders, each one call's carry: .dev1 (the wheels the machine lacks, the
# corpus, the first 41 MiB of SmolLM2's GGUF, stage1.sh) and .dev2 (the rest of the GGUF and
# search_r1_gpu.sh). Run scripts/device/travel_light.sh on first: the tree must leave them room.
# usage: scripts/device/prepare_search_r1.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
E=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$E")"; touch "$E"
grep -q '^/.dev1/' "$E" || printf '/.dev1/\n/.dev2/\n' >> "$E"
G=$(.venv/bin/python -c "from ragrl.models.lm_weights import smollm2_gguf_path; print(smollm2_gguf_path())")
KIT=$(.venv/bin/python -c "from ragrl.paths import data_kit; print(data_kit())")
rm -rf .dev1 .dev2 && mkdir -p .dev1/whl .dev1/data/corpus .dev2
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
  -d .dev1/whl gguf==0.19.0 bm25s==0.3.16 PyStemmer==3.1.0
A=$((41 * 1048576))
head -c $A "$G" > .dev1/part_a && tail -c +$((A + 1)) "$G" > .dev2/part_b
cp "$KIT/corpus/wiki_passages.jsonl.gz" .dev1/data/corpus/
cp scripts/device/stage1.sh scripts/device/wsum.py .dev1/ && cp scripts/device/search_r1_gpu.sh .dev2/
sha256sum "$G"
.venv/bin/python scripts/device/wsum.py "$(.venv/bin/python -c "from ragrl.models.lm_weights import resolve_policy; print(resolve_policy('smollm2-135m-instruct'))")"
du -sh .dev1 .dev2
printf 'what travels besides them: %s MiB\n' "$(git ls-files -co --exclude-standard | grep -v '^\.dev[12]/' | xargs -d '\n' du -cb 2>/dev/null | tail -1 | cut -f1 | awk '{printf "%.1f", $1/1048576}')"
