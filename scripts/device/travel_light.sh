#!/bin/bash
# The tree a device call sends (tracked and untracked-not-ignored files) holds the data kit (52 MB of
# the 64 MiB a call may carry). `on` takes the kit's large files, docs/ and experiments/ out of the
# index (they stay on disk, ignored through .git/info/exclude) so that a call's carry has room for the
# model; `off` puts them back exactly as HEAD has them. Nothing is committed either way.
# usage: scripts/device/travel_light.sh on|off
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
E=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$E")"; touch "$E"
PATHS=(datakit/src/ragrl_data/corpus datakit/src/ragrl_data/embeddings datakit/src/ragrl_data/train
       datakit/src/ragrl_data/eval docs experiments)
MARK="# travel_light"
case "${1:-}" in
  on)
    git rm -r -q --cached "${PATHS[@]}"
    if ! grep -q "$MARK" "$E"; then
      echo "$MARK" >> "$E"; for p in "${PATHS[@]}"; do echo "/$p/" >> "$E"; done
    fi
    ;;
  off)
    git reset -q -- "${PATHS[@]}"
    python3 - "$E" "${PATHS[@]}" <<'PY'
import sys
path, gone = sys.argv[1], {f"/{p}/" for p in sys.argv[2:]} | {"# travel_light"}
lines = [l for l in open(path).read().splitlines() if l.strip() not in gone]
open(path, "w").write("\n".join(lines) + ("\n" if lines else ""))
PY
    ;;
  *) echo "usage: $0 on|off" >&2; exit 2 ;;
esac
printf 'what travels: %s MiB\n' "$( (git ls-files -co --exclude-standard | xargs -d '\n' du -cb 2>/dev/null | tail -1 | cut -f1) | awk '{printf "%.1f", $1/1048576}')"
