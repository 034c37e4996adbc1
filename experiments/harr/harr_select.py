"""Choosing HARR's tiny settings on held-apart questions only: a fast on-policy probe.

    .venv/bin/python -m experiments.harr.harr_select --name ema --ema 0.99   # -> experiments/harr/results/harr_select/ema.json

Trains the MiniLM query encoder with GRPO over Plackett–Luce draws (reward: evidence recall of
the 3 drawn passages + `--ans` if one holds the answer) on `multihop-train`, and evaluates
deterministic recall@3 / answer@3 on `multihop-dev` (held apart: 200 HotpotQA, 100 MuSiQue-train
and 137 2Wiki questions) every --every steps. No eval/ question is read.

Why a separate loop: with one PPO epoch the sampling log-probs equal the update's, so a step can
sample from the same forward pass it differentiates (one encoder pass per step instead of the
trainer's two). It is a probe for comparing settings quickly; the held-out figures come from the
trainer itself (harr_curve.py, `ragrl quickstart`). The rule used to choose (fixed before the runs
it chose among): the highest mean dev recall@3 over the evaluations from step 100 on.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--questions", type=int, default=16, help="questions per step")
    ap.add_argument("--n", type=int, default=8, help="draws per question")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--pool", type=int, default=30)
    ap.add_argument("--kl", type=float, default=0.0, help="k3 KL to the starting encoder, in the loss")
    ap.add_argument("--ans", type=float, default=0.5, help="weight of answer_in_docs")
    ap.add_argument("--ema", type=float, default=0.0, help="evaluate an EMA of the weights (0: off)")
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--no-2wiki", action="store_true", help="train without the 2Wiki pool questions")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)

    from ragrl.algos.plackett_luce import pl_log_prob, pl_sample
    from ragrl.datasets import load_questions
    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.retrieval.index import load_index
    from ragrl.rewards.qa import answer_in, is_yes_no
    from ragrl.retrieval.resolve import cached_dense_index

    dense = load_index(cached_dense_index("kit:corpus/wiki_passages.jsonl.gz",
                                          "kit:embeddings/wiki_passages.all-minilm-l6-v2.fp16.npy",
                                          "all-minilm-l6-v2")).backend
    vectors, corpus = torch.from_numpy(np.ascontiguousarray(dense.embeddings, dtype=np.float32)), dense.corpus
    train = [q for q in load_questions("multihop-train") if not (args.no_2wiki and q["dataset"] == "2wikimultihopqa")]
    dev = load_questions("multihop-dev")
    families = sorted({q["dataset"] for q in dev})

    enc = QueryEncoder("all-minilm-l6-v2")
    ref = copy.deepcopy(enc).requires_grad_(False) if args.kl > 0 else None
    ema = copy.deepcopy(enc).requires_grad_(False) if args.ema > 0 else None
    opt = torch.optim.AdamW([p for p in enc.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    holds = {}

    def holds_answer(q: dict, row: int) -> float:
        if (q["id"], row) not in holds:
            holds[q["id"], row] = 0.0 if is_yes_no(q["answers"]) else float(
                answer_in([f"{corpus.titles[row]}. {corpus.texts[row]}"], q["answers"]))
        return holds[q["id"], row]

    def evaluate(model) -> dict:
        _, rows = dense.index.search(np.ascontiguousarray(model.encode([q["question"] for q in dev])), 3)
        per = {f: {"recall": [], "answer": []} for f in families + ["all"]}
        for q, r in zip(dev, rows):
            ids = {corpus.ids[x] for x in r}
            for f in (q["dataset"], "all"):
                per[f]["recall"].append(len(set(q["gold_passage_ids"]) & ids) / len(q["gold_passage_ids"]))
                if not is_yes_no(q["answers"]):
                    per[f]["answer"].append(max(holds_answer(q, int(x)) for x in r))
        return {f"{f}/{k}": 100 * float(np.mean(v)) for f, d in per.items() for k, v in d.items()}

    rng, g = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    order, curve, t0 = [], [{"step": 0, **evaluate(enc)}], time.perf_counter()
    print(json.dumps(curve[-1]), flush=True)
    for step in range(args.steps):
        if not order:   # a new epoch; its last step takes what is left
            order = list(range(len(train)))
            rng.shuffle(order)
        batch = [train[order.pop()] for _ in range(min(args.questions, len(order)))]
        q = enc([b["question"] for b in batch])                                    # [Q, d]
        _, rows = dense.index.search(np.ascontiguousarray(q.detach().numpy()), args.pool)
        rows_t = torch.from_numpy(rows.astype(np.int64))
        scores = torch.einsum("qd,qmd->qm", q, vectors[rows_t]).repeat_interleave(args.n, 0)   # [Q*n, M]
        picks = pl_sample(scores.detach(), 3, generator=g, temperature=args.temperature)
        logp = pl_log_prob(scores, picks, args.temperature)                        # [Q*n]
        reward = torch.zeros(len(batch) * args.n)
        for i, b in enumerate(batch):
            for j in range(args.n):
                drawn = [int(rows[i, p]) for p in picks[i * args.n + j].tolist()]
                recall = len(set(b["gold_passage_ids"]) & {corpus.ids[x] for x in drawn}) / len(b["gold_passage_ids"])
                reward[i * args.n + j] = recall + args.ans * max(holds_answer(b, x) for x in drawn)
        r = reward.view(len(batch), args.n)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).reshape(-1)   # GRPO
        loss = -(adv * logp).mean()
        if ref is not None:
            ref_scores = torch.einsum("qd,qmd->qm", ref([b["question"] for b in batch]), vectors[rows_t])
            d = pl_log_prob(ref_scores.repeat_interleave(args.n, 0), picks, args.temperature) - logp
            loss = loss + args.kl * (torch.exp(d) - d - 1).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(enc.parameters(), 1.0)
        opt.step()
        if ema is not None:
            with torch.no_grad():
                for pe, p in zip(ema.parameters(), enc.parameters()):
                    pe.lerp_(p.detach(), 1 - args.ema)
        if (step + 1) % args.every == 0:
            curve.append({"step": step + 1, "train_reward": float(reward.mean()), **evaluate(ema or enc)})
            print(json.dumps(curve[-1]), flush=True)
    late = [c["all/recall"] for c in curve if c["step"] >= 100]
    out = RESULTS / "harr_select" / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": vars(args), "train_questions": len(train), "dev_questions": len(dev),
                               "minutes": (time.perf_counter() - t0) / 60,
                               "rule_mean_recall_from_step_100": float(np.mean(late)) if late else None,
                               "curve": curve}, indent=1))
    print(f"mean dev recall@3 from step 100: {np.mean(late):.2f} -> {out}")


if __name__ == "__main__":
    main()
