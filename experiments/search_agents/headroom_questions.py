"""The training questions where Search-R1's `learn` variant's one query can pay (issue #53, candidate V).

The variant's SFT stage (`sft.builder: missed_after_question`) keeps a question only where a gold title
that the question or its own top 3 name is missing from those passages, and the episode that searches
that title shows the answer; these are the questions on which naming a missed gold title, the query
that pays under the variant's reward (`second_search_ceiling.py`), is possible from what the policy
reads. This writes those questions of a training file, unchanged, to a JSONL.gz that `data.train` reads.
Computed from the training file, its gold passage ids and answers and the corpus only (BM25, the
tokenizer); no held-apart or `eval/` question is read. Seconds on a CPU.

    .venv/bin/python -m experiments.search_agents.headroom_questions \\
        --out experiments/search_agents/results/pool_train_headroom.jsonl.gz
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
from pathlib import Path

from ragrl.datasets import load_questions
from ragrl.methods.synthetic import missed_after_question_episodes
from ragrl.models.lm_weights import load_tokenizer
from ragrl.retrieval.resolve import retriever_for
from ragrl.train.recipe import load_train_config


def headroom_questions(recipe: str, variant: str, overrides: list[str]) -> tuple[list[dict], int]:
    """(the training questions the recipe's missed_after_question SFT keeps, in file order; all of them)."""
    cfg = load_train_config(recipe, overrides, variant)
    kept = {t.sample_id for t in missed_after_question_episodes(
        cfg, load_tokenizer(cfg.model.name), retriever_for(cfg.data.index, cfg.data.corpus))}
    questions = load_questions(cfg.data.train)
    return [q for q in questions if q["id"] in kept], len(questions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="search_r1_grpo")
    ap.add_argument("--variant", default="learn")
    ap.add_argument("--set", action="append", default=[], help="a recipe override, key=value (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    kept, total = headroom_questions(args.recipe, args.variant, args.set)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in kept).encode()
    with gzip.GzipFile(args.out, "wb", mtime=0) as f:   # mtime 0: the same questions, the same bytes
        f.write(data)
    print(f"{len(kept)} of {total} questions -> {args.out} (sha256 of the rows {hashlib.sha256(data).hexdigest()[:12]})")


if __name__ == "__main__":
    main()
