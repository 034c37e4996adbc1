#!/usr/bin/env bash
# Issue #41: choose the main job's retriever on multihop-dev only, by a rule fixed before the runs
# (experiments/README.md, "Multi-hop selection"). Every run is experiments.harr.harr_curve with the
# tiny recipe's settings; its held-out tables are reported, never used to choose.
#   bash experiments/harr/multihop_select.sh stage1          # reward weight, on 1 hop x top 6
#   bash experiments/harr/multihop_select.sh stage2 W        # 2 hops x 3, with and without history
set -euo pipefail
PY=${PY:-.venv/bin/python}
COMMON=(--no-curve --every 50 --minutes 60 --set steps=200 --set keep_best=answer_at_k)
reward() { echo "reward_schedule=[[0, {gold_recall: 1.0, answer_in_docs: $1}]]"; }
case "$1" in
  stage1)
    for w in 0.5 2.0; do
      $PY -m experiments.harr.harr_curve --name "mh_1hop_w${w}" "${COMMON[@]}" --set rollout.topk=6 --set "$(reward $w)"
    done ;;
  stage2)
    TWO=(--set retriever.hops=2 --set retriever.history_branches=2 --set retriever.history_words=5 --set "$(reward "$2")")
    $PY -m experiments.harr.harr_curve --name "mh_2hop_history_w$2" "${COMMON[@]}" "${TWO[@]}"
    $PY -m experiments.harr.harr_curve --name "mh_2hop_nohistory_w$2" "${COMMON[@]}" "${TWO[@]}" --set retriever.history=false ;;
esac
