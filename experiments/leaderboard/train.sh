#!/bin/bash
# The leaderboard's training runs (docs/results/leaderboard.md), each on its own recipe's training data
# (train/ pools only). A finished run is skipped, so the script can be run again after a kill.
#     bash experiments/leaderboard/train.sh                  # the leaderboard of 2026-11-27: tiny recipes
#     VARIANT=learn bash experiments/leaderboard/train.sh    # issue #53's remake: the learn variants
# tiny: RL bounded to 6 minutes of wall time on this machine (`--minutes 6`; the SFT warm start before
# it is not bounded). The search agents' tiny recipes default to the bundled demo corpus and to demo-eval
# for their end-of-run evaluation: here they search the full 51k-passage corpus, as the comparison does,
# and evaluate on pool-dev (held apart from their training questions, none of them an eval/ question).
# learn: each variant's fixed step count (its recipe already trains on pool-train over the full corpus
# and evaluates on pool-dev); --minutes 90 is a safety bound only, which a cut run reports loudly.
# R1-Searcher's stage 2 starts from stage 1 either way; HARR runs its tiny recipe (the main job's) either way.
# A run stopped part-way (its folder exists, no final adapter) goes on with --resume: from its last
# checkpoint, or from its SFT adapter when the SFT had finished, so the remake can span sessions.
# ONLY="search_r1_grpo harr_grpo" trains just the runs named (the remake's parts, one session each).
# It exits 1, naming them, where a run it trained did not finish.
set -u
cd "$(dirname "$0")/../.."
VARIANT=${VARIANT:-tiny}
ONLY=${ONLY:-}
if [ "$VARIANT" = tiny ]; then
  T=runs/leaderboard/train; MINUTES=6
  C="--set data.corpus=kit:corpus/wiki_passages.jsonl.gz --set data.eval=pool-dev"
else
  T=runs/leaderboard_$VARIANT/train; MINUTES=90; C=""
fi
mkdir -p $T
run() {
  name=$1; variant=$2; shift 2
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  if [ -d $T/$name/final_adapter ] || [ -d $T/$name/final_encoder ]; then echo "skip $name"; return; fi
  resume=(); [ -d $T/$name ] && resume=(--resume)
  s=$(date +%s)
  .venv/bin/ragrl train $name --variant $variant --minutes $MINUTES "${resume[@]}" --set out_dir=$T/$name "$@" >> $T/$name.log 2>&1
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - s ))s"
  [ $rc = 0 ] || FAILED="$FAILED $name"
}
FAILED=""
run search_r1_grpo $VARIANT $C
run r1_searcher_stage1 $VARIANT $C
run r1_searcher_stage2 $VARIANT $C --set model.init_adapter=$T/r1_searcher_stage1/final_adapter
run rag_r1_ppo $VARIANT $C
run smartrag_ppo $VARIANT
run mmoa_mappo $VARIANT
run harr_grpo tiny   # HARR's tiny recipe is the main job's, and learns on this CPU already
# The later runs go on after one fails (each is its own); the exit status says one did, for part.sh.
[ -z "$FAILED" ] || { echo "did not finish:$FAILED (their logs: $T/<name>.log)" >&2; exit 1; }
