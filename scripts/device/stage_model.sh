#!/bin/bash
# What every lent-GPU run of SmolLM2 needs, in two git-ignored folders that each fit one call's carry
# (scripts/device/README.md): .dev1 (the wheels the machine lacks, the corpus, the first PART_A_MIB of
# SmolLM2's GGUF, stage1.sh and wsum.py) and .dev2 (the rest of the GGUF). The run's own files go into
# .dev2 after it (prepare.sh, prepare_search_r1.sh). Prints the GGUF's and the converted weights' hashes,
# which the device run prints too. Run scripts/device/travel_light.sh on first.
# usage: [PART_A_MIB=41] scripts/device/stage_model.sh
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
A=$(( ${PART_A_MIB:-41} * 1048576 ))
head -c $A "$G" > .dev1/part_a && tail -c +$((A + 1)) "$G" > .dev2/part_b
cp "$KIT/corpus/wiki_passages.jsonl.gz" .dev1/data/corpus/
cp scripts/device/stage1.sh scripts/device/wsum.py .dev1/
sha256sum "$G"
.venv/bin/python scripts/device/wsum.py "$(.venv/bin/python -c "from ragrl.models.lm_weights import resolve_policy; print(resolve_policy('smollm2-135m-instruct'))")"
