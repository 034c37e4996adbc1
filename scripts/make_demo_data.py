"""Build the bundled demo slice (src/ragrl/data/) from the data kit (ragrl.paths.data_kit).

Deterministic: the same inputs give the same bytes (gzip mtime=0, fixed seed).

- train questions: the 200 HotpotQA-train + MuSiQue-train questions of
  `train/multihop_train_with_context.jsonl.gz` (a real train split, with gold passages), then
  the HotpotQA/2Wiki-train questions of R1-Searcher's training set whose answer BM25 finds in the
  top 3 passages of the full corpus for the question itself ("reachable": RL needs questions the
  corpus can answer). Their `gold_passage_ids` are those answer-bearing passages, a heuristic
  marked by `"gold_source": "bm25_answer_match"`;
- eval questions: 300 HotpotQA *dev* questions (a fixed random sample, seed 0);
- corpus: every context paragraph (gold + distractors) of the 500 questions with contexts, plus
  the top-5 BM25 passages of each reachable R1-Searcher question.
"""
from __future__ import annotations

import gzip
import io
import json
import random
import sys
from pathlib import Path

from ragrl.paths import data_kit

SHARED = Path(sys.argv[1]) if len(sys.argv) > 1 else data_kit()   # the kit ragrl reads: $RAGRL_DATA or ragrl-data
OUT = Path(__file__).resolve().parents[1] / "src" / "ragrl" / "data"
N_EVAL = 300
KEEP = ("id", "question", "answers", "dataset", "split", "type", "level",
        "supporting_titles", "gold_passage_ids", "gold_source", "context_passage_ids")


def read(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write(path: Path, rows: list[dict]) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as g:
        for r in rows:
            g.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
    path.write_bytes(buf.getvalue())


def reachable_train(corpus: list[dict], k_gold: int = 3, k_keep: int = 5) -> list[dict]:
    """R1-Searcher train questions whose (non yes/no) answer is in BM25's top 3 for the question."""
    from ragrl.retrieval.bm25 import BM25Index
    from ragrl.retrieval.corpus import Corpus
    from ragrl.rewards.qa import normalize_answer

    index = BM25Index.build(Corpus(ids=[p["id"] for p in corpus], titles=[p["title"] for p in corpus],
                                   texts=[p["text"] for p in corpus], sha256="full-kit-corpus"))
    rows = read(SHARED / "train/hotpotqa_2wiki_train_r1searcher.jsonl.gz")
    out = []
    for start in range(0, len(rows), 512):
        batch = rows[start:start + 512]
        for r, hits in zip(batch, index.search([r["question"] for r in batch], k_keep)):
            golds = [g for g in map(normalize_answer, r["answers"]) if g and g not in ("yes", "no")]
            with_answer = [h.id for h in hits[:k_gold]
                           if any(f" {g} " in f" {normalize_answer(h.title + ' ' + h.text)} " for g in golds)]
            if with_answer:
                out.append({**r, "gold_passage_ids": with_answer[:2], "gold_source": "bm25_answer_match",
                            "context_passage_ids": [h.id for h in hits]})
    return out


def main() -> None:
    full = read(SHARED / "corpus/wiki_passages.jsonl.gz")
    train = read(SHARED / "train/multihop_train_with_context.jsonl.gz")
    train += reachable_train(full)
    dev = [r for r in read(SHARED / "eval/hotpotqa_dev.jsonl.gz") if r.get("context_passage_ids")]
    rng = random.Random(0)
    rng.shuffle(dev)
    evalq = sorted(dev[:N_EVAL], key=lambda r: r["id"])
    need = {pid for r in train + evalq for pid in r["context_passage_ids"] + r["gold_passage_ids"]}
    corpus = [
        {"id": p["id"], "title": p["title"], "text": p["text"]}
        for p in full if p["id"] in need
    ]
    assert len(corpus) == len(need), "a context passage is missing from the corpus"
    OUT.mkdir(parents=True, exist_ok=True)
    write(OUT / "corpus.jsonl.gz", corpus)
    write(OUT / "train.jsonl.gz", [{k: r[k] for k in KEEP if k in r} for r in train])
    write(OUT / "eval.jsonl.gz", [{k: r[k] for k in KEEP if k in r} for r in evalq])
    print(f"corpus {len(corpus)} passages, train {len(train)}, eval {len(evalq)} -> {OUT}")


if __name__ == "__main__":
    main()
