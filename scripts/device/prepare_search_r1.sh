#!/bin/bash
# Stage issue #53's GPU run (scripts/device/README.md, "The Search-R1 learn variant at a paper-like
# batch"): stage_model.sh's two folders, with search_r1_gpu.sh in .dev2. Run travel_light.sh on first.
# usage: scripts/device/prepare_search_r1.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
scripts/device/stage_model.sh
cp scripts/device/search_r1_gpu.sh .dev2/
du -sh .dev1 .dev2
printf 'what travels besides them: %s MiB\n' "$(git ls-files -co --exclude-standard | grep -v '^\.dev[12]/' | xargs -d '\n' du -cb 2>/dev/null | tail -1 | cut -f1 | awk '{printf "%.1f", $1/1048576}')"
