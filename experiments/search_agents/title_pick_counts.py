"""What a second query chosen among the title candidates finds, searched alone or after the question.

Issue #53's candidate W constrains its second query to the corpus titles its question and first
passages name (`rollout.second_query: title`). On `eval/` its pick names a missed gold title in one
episode of five and gains there, and elsewhere the title it searches costs against the question's own
top N. This counts, before any rule that would change the query, what the choice is worth per
candidate: for each question, every candidate `title_candidates` gives the episode (the runner's
search of the question as the variant's first turn shows it), searched as the title alone or as the
question followed by the title, top 3 each, and the search gain at equal passages against the
question's own top N (N the distinct passages of both searches). Reported per mode: the mean gain of a
blind pick (every candidate of a question equally likely), of the best candidate (the ceiling of
choosing well), of the candidates that are not a missed gold title, and the share of picks that lose.

Reads a training file only (the first `--n` questions of `pool-train` by default; yes/no questions and
questions without gold passage ids left out), BM25 over the full corpus, the tokenizer. A minute on a CPU.

    .venv/bin/python -m experiments.search_agents.title_pick_counts \\
        --out experiments/search_agents/results/title_pick_counts_pool_train.json
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path

from experiments.search_agents.second_search_ceiling import gain
from ragrl.datasets import load_questions
from ragrl.methods.synthetic import corpus_passages, synth_trajectory
from ragrl.models.lm_weights import load_tokenizer
from ragrl.retrieval.resolve import retriever_for
from ragrl.rewards.qa import is_yes_no
from ragrl.rollout.protocol import get_protocol
from ragrl.rollout.title_queries import gazetteer_of, title_candidates
from ragrl.text import normalize_answer
from ragrl.train.recipe import load_train_config

MODES = ("title", "question + title")


def _mean(values: list[float]) -> float | None:
    return round(100 * sum(values) / len(values), 1) if values else None


def pick_counts(cfg, questions: list[dict], tok, retriever) -> dict:
    """The per-mode figures above, over `questions` (dicts with question, answers, gold_passage_ids)."""
    protocol, passages, gazetteer = get_protocol(cfg.agent), corpus_passages(cfg.data.index, cfg.data.corpus), gazetteer_of(retriever)
    rng = random.Random(cfg.seed)
    episode = replace(cfg.rollout, max_turns=3)   # the question's search, the one query, the answer, as the SFT writes it
    rows = []   # (question, first search's ids, its candidates, which of them are missed gold titles)
    for q in questions:
        traj = synth_trajectory(tok, protocol, q, retriever, passages, episode, rng, runner_first="question",
                                next_query="missed_gold", runner_second=True)
        first = traj.turns[0].passage_ids[0]
        missed = {normalize_answer(passages[g].title) for g in q["gold_passage_ids"] if g not in first and g in passages}
        cands = title_candidates(gazetteer, traj)
        rows.append((q, first, cands, [normalize_answer(c) in missed for c in cands]))
    with_cands = [r for r in rows if r[2]]
    deep = retriever.search([r[0]["question"] for r in with_cands], 30)
    out = {"questions": len(rows), "with_candidates": len(with_cands),
           "candidates_median": sorted(len(r[2]) for r in rows)[len(rows) // 2] if rows else 0,
           "with_a_missed_gold_candidate": sum(any(r[3]) for r in rows)}
    for mode in MODES:
        queries = [c if mode == "title" else f"{r[0]['question']} {c}" for r in with_cands for c in r[2]]
        hits = iter(retriever.search(queries, cfg.rollout.topk))
        blind, best, wrong, lost = [], [], [], 0
        for (q, first, _, is_missed), d in zip(with_cands, deep):
            gains = []
            for gold_pick in is_missed:
                shown = dict.fromkeys(first + [h.id for h in next(hits)])
                g = gain([passages[pid].full_text for pid in shown], [h.full_text for h in d], q["answers"])
                gains.append(g)
                lost += g < 0
                if not gold_pick:
                    wrong.append(g)
            blind.append(sum(gains) / len(gains))
            best.append(max(gains))
        picks = sum(len(r[2]) for r in with_cands)
        out[mode] = {"blind_pick": _mean(blind), "best_candidate": _mean(best), "not_a_missed_gold": _mean(wrong),
                     "picks_that_lose": round(100 * lost / picks, 1) if picks else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="pool-train", help="a training file (never eval/)")
    ap.add_argument("--n", type=int, default=300, help="its first N questions")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = load_train_config("search_r1_grpo", [f"data.train={args.data}"], "learn")
    questions = [q for q in load_questions(cfg.data.train, limit=args.n)
                 if q.get("gold_passage_ids") and not is_yes_no(q["answers"])]
    result = {"data": args.data, "n": args.n, "corpus": cfg.data.corpus,
              **pick_counts(cfg, questions, load_tokenizer(cfg.model.name), retriever_for(cfg.data.index, cfg.data.corpus))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
