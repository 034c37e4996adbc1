#!/bin/bash
# Stage an MMOA run for a lent GPU machine (scripts/device/README.md): stage_model.sh's two folders,
# with the start adapter and run_mmoa.sh in .dev2 (the GGUF split so that both fit one call's carry
# beside the tree that travel_light.sh leaves). Run scripts/device/travel_light.sh on first.
# usage: scripts/device/prepare.sh START_ADAPTER_DIR
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
START=${1:?usage: $0 START_ADAPTER_DIR}
PART_A_MIB=45 scripts/device/stage_model.sh
cp scripts/device/run_mmoa.sh .dev2/ && cp -r "$START" .dev2/s5
du -sh .dev1 .dev2
