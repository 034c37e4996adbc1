"""What a group-relative reward could teach at most: the best of the policy's own samples (issue #53).

GRPO moves a policy toward the samples of its group that scored above the others; it cannot reach
a query its samples never hold. So the best of a question's n samples (best-of-n) bounds what RL on
those samples could find, and its distance from the greedy episode says how much room RL has. This
samples n training episodes per question from a Search-R1 start in a given shape (the `learn`
variant with `--set` overrides, an adapter optional; training episodes end on their last search's
passages, `rollout.end_after_searches`, as in training) and scores each one with the judged measure
(`ragrl.eval.search_gain`: the search gain at equal passages, yes/no questions left out). Per
question it takes the greedy episode's gain, the samples' mean and their best; pooled, each with a
95% bootstrap CI, and the share of questions where some sample beats the question's own search, or
where every sample loses to it. Reads training questions only (the last N of `pool-train`), BM25 over
the full corpus; it decides nothing. Minutes on a CPU.

    .venv/bin/python -m experiments.search_agents.own_query_ceiling --name am_start \\
        --set rollout.max_turn_tokens=64 --out experiments/search_agents/results/own_query_ceiling_am_start
"""
from __future__ import annotations

import argparse
import collections
from dataclasses import replace

import torch
from peft import PeftModel

from ragrl.datasets import load_questions
from ragrl.engines.registry import make_engine
from ragrl.eval.cells import ci_cell, markdown_table, write_results
from ragrl.eval.search_gain import annotate_search_gain
from ragrl.eval.stats import ci_record
from ragrl.models.lm_weights import load_policy
from ragrl.rollout.multi_turn import run_episodes
from ragrl.rollout.protocol import get_protocol
from ragrl.train.recipe import load_train_config
from ragrl.train.setup import default_retriever


def sample_gains(engine, protocol, retriever, samples, rollout) -> dict[str, list[float]]:
    """Each question's search gains, one per episode (none for a yes/no question)."""
    with torch.no_grad():
        trajs, _ = run_episodes(engine, protocol, retriever, samples, rollout)
    annotate_search_gain(trajs, retriever)
    gains = collections.defaultdict(list)
    for t in trajs:
        if t.metrics.get("search_gain") is not None:
            gains[t.sample_id].append(t.metrics["search_gain"])
    return gains


def ceiling(greedy: dict[str, list[float]], sampled: dict[str, list[float]], n: int) -> dict:
    """Per question (those with a greedy gain and all n sampled ones): the greedy gain, the samples'
    mean and their best, pooled with 95% CIs (percent), and the shares of questions (percent) where
    the best sample beats the question (> 0), where every sample loses (< 0), and where the greedy
    episode loses but some sample does not.

    >>> out = ceiling({"a": [-1.0], "b": [0.0], "c": [0.0]}, {"a": [-1.0, 1.0], "b": [0.0, 0.0], "c": [-1.0, -1.0]}, 2)
    >>> out["questions"], out["search_gain"]["best of 2"]["mean"], round(out["search_gain"]["sample mean"]["mean"], 1)
    (3, 0.0, -33.3)
    >>> out["share_some_sample_beats_the_question"], out["share_every_sample_loses"], out["share_greedy_loses_but_a_sample_does_not"]
    (33.3, 33.3, 33.3)
    """
    ids = [i for i in greedy if len(sampled.get(i, [])) == n]
    best = [max(sampled[i]) for i in ids]
    rows = {"greedy": [greedy[i][0] for i in ids], "sample mean": [sum(sampled[i]) / n for i in ids],
            f"best of {n}": best}
    share = lambda hits: round(100 * sum(hits) / len(ids), 1)
    return {"questions": len(ids), "n": n, "search_gain": {k: ci_record(v) for k, v in rows.items()},
            "share_some_sample_beats_the_question": share(b > 0 for b in best),
            "share_every_sample_loses": share(b < 0 for b in best),
            "share_greedy_loses_but_a_sample_does_not": share(greedy[i][0] < 0 <= max(sampled[i]) for i in ids)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="what the table calls this start and shape")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="an override of search_r1_grpo's learn variant (repeatable), as `ragrl train --set`")
    ap.add_argument("--adapter", help="a LoRA adapter folder for the start (default: the instruct model)")
    ap.add_argument("--questions", type=int, default=100, help="the last N questions of pool-train")
    ap.add_argument("--n", type=int, default=8, help="samples per question, at the variant's temperature")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out", required=True, help="output path without extension (.json and .md)")
    args = ap.parse_args()
    cfg = load_train_config("search_r1_grpo", args.sets, variant="learn")
    retriever = default_retriever(cfg)
    model, tok = load_policy(cfg.model.name)
    if args.adapter:
        model = PeftModel.from_pretrained(model, args.adapter).merge_and_unload()
    engine, protocol = make_engine("hf", model.eval(), tok), get_protocol(cfg.agent)
    samples = [{**s, "id": str(s.get("id", i))} for i, s in enumerate(load_questions("pool-train")[-args.questions:])]
    rollout = replace(cfg.rollout, end_after_searches=cfg.rollout.end_after_searches or 1, seed=args.seed)
    greedy = sample_gains(engine, protocol, retriever, samples, replace(rollout, n=1, temperature=0.0))
    sampled = sample_gains(engine, protocol, retriever, samples, replace(rollout, n=args.n))
    result = {"name": args.name, "overrides": args.sets, "adapter": args.adapter,
              "file": f"pool-train (last {args.questions})", "temperature": rollout.temperature,
              **ceiling(greedy, sampled, args.n)}
    md = [f"{args.name}: {result['questions']} questions (the last {args.questions} of pool-train, yes/no left out), "
          f"{args.n} samples each at temperature {rollout.temperature}; search gain at equal passages", "",
          *markdown_table(["episode", "search gain"], [[k, ci_cell(v, signed=True)] for k, v in result["search_gain"].items()]),
          "", f"some sample beats the question: {result['share_some_sample_beats_the_question']}% of questions; "
          f"every sample loses: {result['share_every_sample_loses']}%; greedy loses but a sample does not: "
          f"{result['share_greedy_loses_but_a_sample_does_not']}%"]
    write_results(args.out, result, md)


if __name__ == "__main__":
    main()
