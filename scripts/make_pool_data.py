"""Build the bundled training questions for the full corpus from the data kit's train/ pools (ragrl.paths.data_kit).

The original train splits' answers are mostly not in the 51k-passage corpus (BM25 answer@3
0.08-0.20), so a policy trained on them learns that retrieval does not pay. The dev pools were
split off the dev sets for training (disjoint from every eval/ file). Deterministic output
(gzip mtime=0, seed 0):

- `pool_train.jsonl.gz`: HotpotQA dev-pool questions (gold passages in the corpus) other than the
  held-apart slice, plus the 200 HotpotQA-train / MuSiQue-train questions of
  `multihop_train_with_context` (gold passages in the corpus too);
- `pool_dev.jsonl.gz`: 200 HotpotQA dev-pool questions held apart, to choose settings and when
  to stop;
- `smartrag_train.jsonl.gz` / `smartrag_dev.jsonl.gz`: PopQA pool questions (long-tail factoid
  questions, where retrieval pays most; 400 / 100 held apart) mixed with as many HotpotQA
  dev-pool questions from pool_train / pool_dev (questions the model may or may not know);
- `multihop_train.jsonl.gz` / `multihop_dev.jsonl.gz` (the retriever's questions): every pool
  question with evidence passages in the corpus, from the three multi-hop families the held-out
  sets have. Train: the HotpotQA dev-pool questions of pool_train, the 100 HotpotQA-train
  questions of `multihop_train_with_context`, and 2Wiki dev-pool questions. Dev (held apart, to
  choose settings and checkpoints on every family the evaluation has): pool_dev's 200 HotpotQA
  questions, the 100 MuSiQue-train questions of `multihop_train_with_context` (the only MuSiQue
  questions with gold passages outside eval/) and 137 2Wiki dev-pool questions. 2Wiki has no
  official supporting passages here: its rows take the kit's `evidence_passage_ids_heuristic`
  (the entity's passage and the nearby passage holding the answer) as `gold_passage_ids`, marked
  `"gold_source": "heuristic_evidence"`. Since issue #41's second round, multihop_train also ends
  with the 600 MuSiQue-train questions of `musique_train_reachable.jsonl.gz` (answers only, no gold
  passages; built by `experiments/harr/musique_train_pool.py`, which needs the dense index, so it is
  a separate step), chosen on multihop-dev by the rule in experiments/README.md.
- `agent_dev.jsonl.gz`: 200 2Wiki dev-pool questions (not yes/no), held apart for the search
  agents' selection rules once pool_dev's 200 were spent (issue #53); no search agent's training
  file holds a 2Wiki question.
- `agent_confirm.jsonl.gz`: the other 364 of those 2Wiki dev-pool questions (not yes/no), from the
  same shuffle, so disjoint from agent_dev: fresh questions to confirm a candidate chosen on
  agent_dev (issue #53's twelfth rule).
No eval/ question is in any file.
"""
from __future__ import annotations

import gzip
import io
import json
import random
import sys
from pathlib import Path

from ragrl.datasets import with_heuristic_gold
from ragrl.paths import data_kit

SHARED = Path(sys.argv[1]) if len(sys.argv) > 1 else data_kit()   # the kit ragrl reads: $RAGRL_DATA or ragrl-data
OUT = Path(__file__).resolve().parents[1] / "src" / "ragrl" / "data"
N_DEV = 200
N_WIKI_DEV = 137
N_AGENT_DEV = 200
KEEP = ("id", "question", "answers", "dataset", "split", "type", "level", "supporting_titles",
        "gold_passage_ids", "context_passage_ids", "gold_source")



def read(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write(rows: list[dict], path: Path) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        for r in rows:
            gz.write((json.dumps({k: r[k] for k in KEEP if k in r}, ensure_ascii=False) + "\n").encode())
    path.write_bytes(buf.getvalue())


def main() -> None:
    pool = [r for r in read(SHARED / "train" / "hotpotqa_dev_pool.jsonl.gz") if r.get("gold_passage_ids")]
    extra = [r for r in read(SHARED / "train" / "multihop_train_with_context.jsonl.gz") if r.get("gold_passage_ids")]
    random.Random(0).shuffle(pool)
    dev, train = pool[:N_DEV], pool[N_DEV:] + extra
    eval_texts = {r["question"].strip().lower() for p in (SHARED / "eval").glob("*.jsonl.gz") for r in read(p)}
    leaked = [r["id"] for r in train + dev if r["question"].strip().lower() in eval_texts]
    if leaked:
        raise SystemExit(f"{len(leaked)} pool questions are also eval questions: {leaked[:5]}")
    write(train, OUT / "pool_train.jsonl.gz")
    write(dev, OUT / "pool_dev.jsonl.gz")
    popqa = read(SHARED / "train" / "popqa_pool.jsonl.gz")
    random.Random(1).shuffle(popqa)
    rng = random.Random(2)
    s_train = popqa[100:] + rng.sample(pool[N_DEV:], len(popqa) - 100)
    s_dev = popqa[:100] + rng.sample(dev, 100)
    rng.shuffle(s_train)
    rng.shuffle(s_dev)
    bad = [r["id"] for r in s_train + s_dev if r["question"].strip().lower() in eval_texts]
    if bad:
        raise SystemExit(f"{len(bad)} popqa pool questions are also eval questions: {bad[:5]}")
    write(s_train, OUT / "smartrag_train.jsonl.gz")
    write(s_dev, OUT / "smartrag_dev.jsonl.gz")
    wiki_pool = with_heuristic_gold(read(SHARED / "train" / "2wikimultihopqa_dev_pool.jsonl.gz"))
    wiki = [r for r in wiki_pool if r.get("gold_passage_ids")]
    random.Random(5).shuffle(wiki)
    musique = [r for r in extra if r["dataset"] == "musique"]
    m_train = pool[N_DEV:] + [r for r in extra if r["dataset"] != "musique"] + wiki[N_WIKI_DEV:]
    m_train += read(OUT / "musique_train_reachable.jsonl.gz")
    m_dev = dev + musique + wiki[:N_WIKI_DEV]
    bad = [r["id"] for r in m_train + m_dev if r["question"].strip().lower() in eval_texts]
    if bad or {r["id"] for r in m_train} & {r["id"] for r in m_dev}:
        raise SystemExit(f"multihop split: eval questions or a train/dev overlap: {bad[:5]}")
    write(m_train, OUT / "multihop_train.jsonl.gz")
    write(m_dev, OUT / "multihop_dev.jsonl.gz")
    # Added after pool_dev's 200 had judged fifteen search-agent candidates (issue #53): 200 2Wiki
    # dev-pool questions no search agent trains on (pool_train holds no 2Wiki), yes/no left out (the
    # search gain skips them). HARR's multihop files hold them too; a retriever run does not choose
    # a search agent's settings.
    a_dev = [r for r in wiki_pool if r["answers"][0].strip().lower() not in ("yes", "no")]
    random.Random(11).shuffle(a_dev)
    # Added after agent_dev's 200 had judged three candidates: the rest of the same shuffle, to confirm
    # on fresh questions a candidate chosen there.
    a_dev, a_confirm = a_dev[:N_AGENT_DEV], a_dev[N_AGENT_DEV:]
    bad = [r["id"] for r in a_dev + a_confirm if r["question"].strip().lower() in eval_texts]
    if bad or {r["id"] for r in a_dev + a_confirm} & {r["id"] for r in train}:
        raise SystemExit(f"agent_dev / agent_confirm: eval questions or pool_train questions: {bad[:5]}")
    write(a_dev, OUT / "agent_dev.jsonl.gz")
    write(a_confirm, OUT / "agent_confirm.jsonl.gz")
    print(f"pool_train: {len(train)} questions, pool_dev: {len(dev)} (held apart); smartrag_train: "
          f"{len(s_train)}, smartrag_dev: {len(s_dev)}; multihop_train: {len(m_train)}, multihop_dev: "
          f"{len(m_dev)}; agent_dev: {len(a_dev)}, agent_confirm: {len(a_confirm)} -> {OUT}")


if __name__ == "__main__":
    main()
