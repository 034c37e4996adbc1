"""How varied a Search-R1 start's first queries are within a group, and how many groups a search-outcome
reward leaves flat, when training episodes end once the first search is served (issue #53's third rule).
Reads training questions only (the last N of `pool-train`), BM25 over the full corpus.

    .venv/bin/python -m experiments.search_agents.probe_first_queries --adapter runs/learn_d/sft/adapter
"""
from __future__ import annotations

import argparse
import collections
import json
from dataclasses import replace

import torch
from peft import PeftModel

from ragrl.datasets import load_questions
from ragrl.engines.registry import make_engine
from ragrl.models.lm_weights import load_policy
from ragrl.rewards.search import answer_rank_reward, question_answer_ranks, search_gain_reward
from ragrl.rollout.multi_turn import run_episodes
from ragrl.rollout.protocol import get_protocol
from ragrl.train.recipe import load_train_config
from ragrl.train.setup import default_retriever


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", required=True, help="the start's LoRA adapter folder")
    ap.add_argument("--questions", type=int, default=16, help="the last N questions of pool-train")
    ap.add_argument("--n", type=int, default=8, help="samples per question (temperature 1)")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    cfg = load_train_config("search_r1_grpo", [], variant="learn")
    retriever = default_retriever(cfg)
    model, tok = load_policy(cfg.model.name)
    model = PeftModel.from_pretrained(model, args.adapter).merge_and_unload().eval()
    samples = load_questions("pool-train")[-args.questions:]
    question_answer_ranks(samples, retriever, 10)
    rollout = replace(cfg.rollout, end_after_searches=1, n=args.n, seed=args.seed)
    with torch.no_grad():
        trajs, _ = run_episodes(make_engine("hf", model, tok), get_protocol(cfg.agent), retriever, samples, rollout)
    groups = collections.defaultdict(list)
    for t in trajs:
        groups[t.group].append(t)
    rows = []
    for g, members in sorted(groups.items()):
        sample = samples[g]
        queries = [t.turns[0].queries[0] if t.turns and t.turns[0].queries else None for t in members]
        rows.append({"question": sample["question"], "distinct_queries": len(set(queries)),
                     "answer_rank": [answer_rank_reward(t, sample) for t in members],
                     "search_gain": [search_gain_reward(t, sample) for t in members]})
    summary = {"groups": len(rows),
               "mean_distinct_queries": sum(r["distinct_queries"] for r in rows) / len(rows),
               "flat_answer_rank": sum(len(set(r["answer_rank"])) == 1 for r in rows),
               "flat_search_gain": sum(len(set(r["search_gain"])) == 1 for r in rows)}
    print(json.dumps({"summary": summary, "groups": rows}, indent=1))


if __name__ == "__main__":
    main()
