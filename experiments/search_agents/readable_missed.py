"""What a query after the question's own search could copy (issue #53, read on `train/` pools only).

For each question: the question's BM25 top 3 (the runner's first search under `rollout.first_action:
question`); the gold passages it missed; which of those have a title that the question or those three
passages name (a query the policy can copy from what it read, as `gold_search_missed`'s SFT writes);
and the search gain at equal passages if the second query is that title, against the question's own
top N (`second_search_ceiling.gain`). Seconds on a CPU.

    .venv/bin/python -m experiments.search_agents.readable_missed --data pool-train \\
        --out experiments/search_agents/results/readable_missed_pool_train.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragrl.compare.runs import resolve_kit
from ragrl.datasets import load_questions
from ragrl.retrieval.corpus import load_corpus
from ragrl.retrieval.resolve import retriever_for
from ragrl.rewards.qa import is_yes_no, normalize_answer

from experiments.search_agents.second_search_ceiling import gain

CORPUS = "kit:corpus/wiki_passages.jsonl.gz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="pool-train", help="a train/ question file (never eval/)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    corpus = load_corpus(resolve_kit(CORPUS))
    retriever = retriever_for(None, CORPUS)
    qs = [q for q in load_questions(args.data) if q.get("gold_passage_ids") and not is_yes_no(q["answers"])]
    first = retriever.search([q["question"] for q in qs], 3)
    deep = retriever.search([q["question"] for q in qs], 30)
    counts = {"questions": len(qs), "top3_holds_every_gold": 0, "a_missed_gold_is_readable": 0,
              "missed_golds_none_readable": 0}
    second_queries, where = [], []
    for i, (q, hits) in enumerate(zip(qs, first)):
        shown = {h.id for h in hits}
        missed = [g for g in q["gold_passage_ids"] if g not in shown and corpus.get(g)]
        if not missed:
            counts["top3_holds_every_gold"] += 1
            continue
        read = f" {normalize_answer(' '.join([q['question']] + [h.full_text for h in hits]))} "
        readable = [g for g in missed if f" {normalize_answer(corpus.get(g)['title'])} " in read]
        if readable:
            counts["a_missed_gold_is_readable"] += 1
            second_queries.append(corpus.get(readable[0])["title"])
            where.append(i)
        else:
            counts["missed_golds_none_readable"] += 1
    second = retriever.search(second_queries, 3) if second_queries else []
    gains = []
    for i, hits2 in zip(where, second):
        shown = {h.id: h.full_text for h in first[i] + hits2}
        gains.append(gain(list(shown.values()), [h.full_text for h in deep[i]], qs[i]["answers"]))
    n = len(qs)
    out = {"data": args.data, "corpus": CORPUS, **counts,
           "readable_share": round(100 * counts["a_missed_gold_is_readable"] / n, 1),
           "search_gain_where_readable": round(100 * sum(gains) / len(gains), 1) if gains else None,
           "search_gain_over_all_questions_if_copied": round(100 * sum(gains) / n, 1),
           "won": sum(g > 0 for g in gains), "lost": sum(g < 0 for g in gains)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
