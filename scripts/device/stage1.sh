set -e
T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/site /tmp/stage /tmp/data /tmp/rh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev1/whl/*.whl
cp .dev1/part_a .dev1/wsum.py /tmp/stage/ && cp -r .dev1/data/corpus /tmp/data/
export PYTHONPATH=/tmp/site:$PWD/src RAGRL_HOME=/tmp/rh RAGRL_DATA=/tmp/data
python3 -c "import torch, transformers, peft, bm25s, Stemmer, gguf, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, peft.__version__, torch.cuda.is_available())"
python3 -c "from ragrl.retrieval.resolve import cached_bm25_index; print(cached_bm25_index('kit:corpus/wiki_passages.jsonl.gz'))"
ls -la /tmp/stage /tmp/data/corpus; echo "stage1 done in $(( $(date +%s) - T0 )) s"
