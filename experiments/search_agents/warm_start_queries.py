"""What an SFT warm start teaches as a further query (issue #53, a diagnostic; BM25 and a tokenizer, seconds).

Builds a recipe's `gold_search` episodes for its training questions, as its SFT stage would, with each
way of choosing the further searches (`every_gold`, the `gold_search` builder; `missed_gold`, the
`gold_search_missed` builder), and sorts each query after the first by what the episode had read when
it wrote it:
- a title an earlier search already showed (searching it again adds no passage);
- a gold title no earlier search showed that the question or an earlier observation holds (a query the
  policy can copy from what it read);
- a gold title no earlier search showed and nothing it read holds (the policy can only guess it).
Counts are over the episodes the SFT stage keeps (those whose observations show an answer) and over all
built. Reads only the recipe's training file (a train/ pool), never eval/.

    .venv/bin/python -m experiments.search_agents.warm_start_queries --recipe search_r1_grpo --variant learn \\
        --out experiments/search_agents/results/warm_start_queries.json
"""
from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

from ragrl.api import load_recipe
from ragrl.datasets import load_questions
from ragrl.methods.synthetic import NEXT_QUERIES, answer_visible, corpus_passages, synth_trajectory
from ragrl.models.lm_weights import load_tokenizer
from ragrl.retrieval.resolve import retriever_for
from ragrl.rewards.qa import normalize_answer
from ragrl.rollout.protocol import get_protocol

KINDS = ("title already shown", "missed gold title it read", "missed gold title it never read", "other")


def padded(text: str) -> str:
    return f" {normalize_answer(text)} "


def query_kind(t, i: int, titles: dict[str, str], gold_ids: list[str]) -> str:
    """What turn i's query names, given what turns before it showed."""
    query = padded(t.turns[i].queries[0])
    shown = {pid for turn in t.turns[:i] for ids in turn.passage_ids for pid in ids}
    if query in {padded(titles[pid]) for pid in shown if pid in titles}:
        return KINDS[0]
    missed = [g for g in gold_ids if g not in shown and g in titles and padded(titles[g]) == query]
    if not missed:
        return KINDS[3]
    read = padded(" ".join([t.question] + [turn.observation for turn in t.turns[:i]]))
    return KINDS[1] if query in read else KINDS[2]


def tally(trajs: list, samples: list[dict], titles: dict[str, str]) -> dict:
    kinds: Counter = Counter()
    for t, s in zip(trajs, samples):
        for i in range(1, len(t.turns)):
            if t.turns[i].kind == "search":
                kinds[query_kind(t, i, titles, s["gold_passage_ids"])] += 1
    total = sum(kinds.values())
    return {"episodes": len(trajs), "searching_more_than_once": sum(t.num_searches > 1 for t in trajs),
            "further_queries": total,
            **{k: {"n": kinds[k], "share": round(100 * kinds[k] / total, 1) if total else None} for k in KINDS}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="search_r1_grpo")
    ap.add_argument("--variant", default="learn")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = load_recipe(args.recipe, variant=args.variant)
    tok = load_tokenizer(cfg.model.name)
    retriever = retriever_for(cfg.data.index, cfg.data.corpus)
    passages = corpus_passages(cfg.data.index, cfg.data.corpus)
    titles = {pid: h.title for pid, h in passages.items()}
    protocol = get_protocol(cfg.agent)
    samples = [s for s in load_questions(cfg.data.train) if s.get("gold_passage_ids")]
    result = {"recipe": args.recipe, "variant": args.variant, "train": cfg.data.train, "corpus": cfg.data.corpus,
              "max_turns": cfg.rollout.max_turns, "topk": cfg.rollout.topk, "builders": {}}
    for next_query in NEXT_QUERIES:
        rng = random.Random(cfg.seed)   # as the SFT stage draws it
        trajs = [synth_trajectory(tok, protocol, s, retriever, passages, cfg.rollout, rng, next_query=next_query)
                 for s in samples]
        kept = [(t, s) for t, s in zip(trajs, samples) if answer_visible(t)]
        result["builders"][next_query] = {
            "kept (answer shown)": tally([t for t, _ in kept], [s for _, s in kept], titles),
            "all built": tally(trajs, samples, titles)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
