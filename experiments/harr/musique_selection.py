"""Issue #41, second round: the rule of experiments/README.md ("MuSiQue questions in training") applied.

    .venv/bin/python -m experiments.harr.musique_selection --a runs/quickstart_150/rl --m runs/mh_musique
        # -> experiments/harr/results/musique_selection.json

For each run's kept encoder (`best_encoder`, chosen by the run on multihop-dev answer@6) and the base
encoder: answer@6 and evidence recall@6 on `multihop-dev` (437 held-apart questions) and on its 100
MuSiQue questions, searching as the runs do (2 hops of 3, HARR's history, 5 words a passage). Then
the rule: M replaces A if M's answer@6 on all 437 >= A's - 0.5 and on the 100 MuSiQue ones >= A's.
No eval/ question is read.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", type=Path, required=True, help="the adopted recipe's run (A)")
    ap.add_argument("--m", type=Path, required=True, help="the candidate run with MuSiQue-train questions (M)")
    ap.add_argument("--out", type=Path, default=RESULTS / "musique_selection.json")
    args = ap.parse_args()

    from ragrl.datasets import load_questions
    from ragrl.eval.retrieval import retrieval_eval
    from ragrl.methods.harr.setup import load_dense_backend
    from ragrl.retrieval.stochastic import multi_hop_searcher
    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.train.recipe import load_train_config

    cfg = load_train_config("harr_grpo", [], "tiny")
    rc, k = cfg.retriever, cfg.rollout.topk
    dense = load_dense_backend(cfg)
    dev = load_questions("multihop-dev")
    parts = {"all": dev, "musique": [q for q in dev if q.get("dataset") == "musique"]}
    encoders = {"base": rc.encoder, "A": str(args.a / "best_encoder"), "M": str(args.m / "best_encoder")}
    out: dict = {"settings": {"hops": rc.hops, "k_per_hop": k, "history": rc.history,
                              "history_words": rc.history_words, "a": str(args.a), "m": str(args.m),
                              "kept_steps": {n: json.loads((p / "best.json").read_text())["step"]
                                             for n, p in (("A", args.a), ("M", args.m))}}}
    for name, path in encoders.items():
        search = multi_hop_searcher(dense, QueryEncoder(path), rc)
        out[name] = {part: retrieval_eval(search, qs, k, hop_size=k) for part, qs in parts.items()}
        print(name, {part: (round(r["answer_at_k"], 1), round(r["recall"], 1)) for part, r in out[name].items()})
    a, m = out["A"], out["M"]
    adopt = (m["all"]["answer_at_k"] >= a["all"]["answer_at_k"] - 0.5
             and m["musique"]["answer_at_k"] >= a["musique"]["answer_at_k"])
    out["rule"] = ("M replaces A if M's multihop-dev answer@6 (437) >= A's - 0.5 and on its 100 MuSiQue "
                   "questions >= A's")
    out["adopt_m"] = adopt
    print("adopt M:", adopt)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
