"""MuSiQue training questions for the retriever (issue #41): answers only, no gold passages.

    .venv/bin/python -m experiments.harr.musique_train_pool [--n 600] [--out FILE]
    .venv/bin/python scripts/make_pool_data.py      # multihop-train = the pools + these rows

`multihop-train` holds no MuSiQue question (the only MuSiQue questions with gold passages outside
`eval/` are `multihop-dev`'s 100), and the held-out MuSiQue answer@6 is the one figure RL did not
raise. The kit's `train/musique_train` (19,938 MuSiQue-train questions, answers, no passages) can
train the retriever on `answer_in_docs` alone (its `gold_recall` is 0 for every draw, and GRPO
compares draws within a question, so the answer term alone orders them).

Which questions: a seeded sample of `train/musique_train`, minus any question of `multihop-dev` or
`eval/` (by text), whose answer is not yes/no and not a bare number (years and counts occur in
thousands of passages, so a draw holding one says little), and occurs (SQuAD-normalised, whole
words) in the base encoder's top-30 pool for the question itself over the full corpus: the pool
the policy draws from, so the reward can vary (HARR's filter then keeps those whose draws differ).
Computed from training questions and the corpus only.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600, help="questions to keep")
    ap.add_argument("--sample", type=int, default=5000, help="questions sampled (seed 0) before the reachability test")
    ap.add_argument("--out", type=Path, default=ROOT / "src" / "ragrl" / "data" / "musique_train_reachable.jsonl.gz",
                    help="scripts/make_pool_data.py appends these rows to multihop_train.jsonl.gz")
    args = ap.parse_args()

    from ragrl.datasets import load_questions
    from ragrl.methods.harr.setup import load_dense_backend
    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.paths import resolve_kit
    from ragrl.retrieval.stochastic import StochasticRetriever
    from ragrl.rewards.qa import answer_in, is_yes_no
    from ragrl.train.recipe import load_train_config

    rows = load_questions("kit:train/musique_train.jsonl.gz")
    banned = {q["question"].strip().lower() for q in load_questions("multihop-dev")}
    for path in sorted(resolve_kit("kit:eval").glob("*.jsonl.gz")):
        banned |= {q["question"].strip().lower() for q in load_questions(str(path))}
    rows = [r for r in rows if r["question"].strip().lower() not in banned and r.get("answers")
            and not is_yes_no(r["answers"]) and not all(re.fullmatch(r"[\d\s.,]+", a) for a in r["answers"])]
    random.Random(0).shuffle(rows)
    rows = rows[: args.sample]
    cfg = load_train_config("harr_grpo", [], "tiny")
    search = StochasticRetriever(load_dense_backend(cfg), QueryEncoder(cfg.retriever.encoder)).searcher(1)
    kept = []
    for start in range(0, len(rows), 256):
        chunk = rows[start: start + 256]
        for row, hits in zip(chunk, search([r["question"] for r in chunk], cfg.retriever.pool)):
            if answer_in([f"{h.title} {h.text}" for h in hits], row["answers"]):
                kept.append({"id": row["id"], "question": row["question"], "answers": row["answers"],
                             "dataset": "musique", "split": "train", "gold_source": "answer_only"})
        if len(kept) >= args.n:
            break
    kept = kept[: args.n]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept).encode())
    args.out.write_bytes(buf.getvalue())
    print(f"{len(kept)} reachable of {min(len(rows), start + 256)} sampled MuSiQue-train questions -> {args.out}")


if __name__ == "__main__":
    main()
