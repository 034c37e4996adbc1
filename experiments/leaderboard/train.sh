#!/bin/bash
# The leaderboard's training runs (docs/results/leaderboard.md): each method's tiny recipe, RL bounded by
# 6 minutes of wall time on this machine (`--minutes 6`; the SFT warm start before it is not bounded),
# each on its own recipe's training data (train/ pools only). The search agents' recipes default to the
# bundled demo corpus and to demo-eval (HotpotQA dev questions) for their end-of-run evaluation: here they
# search the full 51k-passage corpus, as the comparison does, and evaluate on pool-dev (held apart from
# their training questions, none of them an eval/ question). R1-Searcher's stage 2 starts from stage 1.
# A finished run is skipped, so the script can be run again after a kill.
#     RAGRL_DATA=../shared/data bash experiments/leaderboard/train.sh
set -u
cd "$(dirname "$0")/../.."
T=runs/leaderboard/train
C="--set data.corpus=kit:corpus/wiki_passages.jsonl.gz --set data.eval=pool-dev"
mkdir -p $T
run() {
  name=$1; shift
  if [ -d $T/$name/final_adapter ] || [ -d $T/$name/final_encoder ]; then echo "skip $name"; return; fi
  s=$(date +%s)
  .venv/bin/ragrl train $name --variant tiny --minutes 6 --set out_dir=$T/$name "$@" > $T/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - s ))s"
}
run search_r1_grpo $C
run r1_searcher_stage1 $C
run r1_searcher_stage2 $C --set model.init_adapter=$T/r1_searcher_stage1/final_adapter
run rag_r1_ppo $C
run smartrag_ppo
run mmoa_mappo
run harr_grpo
