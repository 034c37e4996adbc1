#!/bin/bash
# One part of issue #53's leaderboard remake (experiments/README.md, "The remake's plan, amended"):
# train the method's run, compare it with its start and the committed baselines on all 803 eval/
# questions, then copy the part's files into experiments/leaderboard/results/ and re-write
# docs/results/leaderboard.md from every part committed so far. About 1.5 hours on 2 cores.
#     bash experiments/leaderboard/part.sh harr_grpo
#     bash experiments/leaderboard/part.sh r1_searcher_stage2    # trains stage 1 first
#     MORE_CACHE=runs/learn_ag_eval bash experiments/leaderboard/part.sh search_r1_grpo
set -euo pipefail
cd "$(dirname "$0")/../.."
RECIPE=${1:?name the part: search_r1_grpo, harr_grpo, r1_searcher_stage2, rag_r1_ppo, smartrag_ppo or mmoa_mappo}
T=runs/leaderboard_learn/train
R=experiments/leaderboard/results
ONLY=$RECIPE
[ "$RECIPE" = r1_searcher_stage2 ] && ONLY="r1_searcher_stage1 r1_searcher_stage2"
# MORE_CACHE="runs/learn_ag_eval": earlier comparisons on the same questions whose systems may be
# reused. A system is reused only where its key matches: the same questions, corpus, index, reader,
# settings and weights (the adapter's digest), so a retrained run with other weights runs anew.
# `ragrl compare` refuses a folder that is not a comparison's; so does this, before the training.
MORE=()
for d in ${MORE_CACHE:-}; do
  [ -d "$d/systems" ] || { echo "MORE_CACHE: $d is not a comparison's output folder (no $d/systems)" >&2; exit 2; }
  MORE+=(--cache-from "$d")
done
VARIANT=learn ONLY="$ONLY" bash experiments/leaderboard/train.sh   # exits 1 (and so does this) where a run did not finish
CACHE=(); [ -d $R/baselines/systems ] && CACHE=(--cache-from $R/baselines)
C=runs/leaderboard_learn/$RECIPE
.venv/bin/ragrl compare $T/$RECIPE --data kit:eval/hotpotqa_dev.jsonl.gz --data kit:eval/musique_dev.jsonl.gz \
  --data kit:eval/2wikimultihopqa_dev.jsonl.gz "${CACHE[@]}" "${MORE[@]}" --out $C
cp $C/compare.json $R/${RECIPE}_compare.json   # first: the comparison is the hour's work
grep -v "f1_vs_searches.png" $C/compare.md > $R/${RECIPE}_compare.md
.venv/bin/python -m experiments.search_agents.per_set --compare $C --run $RECIPE --out $R/${RECIPE}_per_set
.venv/bin/python -m experiments.leaderboard.write_leaderboard $R/*_compare.json \
  --out docs/results/leaderboard.md
echo "part $RECIPE: $R/${RECIPE}_*; now update findings.md and experiments/README.md's progress line"
