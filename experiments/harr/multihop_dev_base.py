"""The base encoder on `multihop-dev` (held apart), for each shape the multi-hop selection compares.

    .venv/bin/python -m experiments.harr.multihop_dev_base     # -> results/multihop_dev_base.json

Shapes: 1 hop of 6, 1 hop of 3, 2 hops of 3 with HARR's history (5 words per passage), 2 hops of 3
without history; dense MiniLM over the full corpus; recall@k and answer@k of every passage the
reader would be given, and with hops the hop that first found a gold passage / the answer.
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {"1hop_top6": (True, 1, 6), "1hop_top3": (True, 1, 3), "2hop_history": (True, 2, 3),
          "2hop_nohistory": (False, 2, 3)}


def main() -> None:
    from ragrl.datasets import load_questions
    from ragrl.eval.retrieval import retrieval_eval
    from ragrl.methods.harr.setup import load_dense_backend
    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.retrieval.stochastic import StochasticRetriever
    from ragrl.train.recipe import load_train_config

    cfg = load_train_config("harr_grpo", [], "tiny")
    dense = load_dense_backend(cfg)
    encoder = QueryEncoder(cfg.retriever.encoder)
    dev = load_questions(cfg.data.eval)
    out = {}
    for name, (history, hops, k) in SHAPES.items():
        search = StochasticRetriever(dense, encoder, history=history, history_words=5).searcher(hops)
        out[name] = retrieval_eval(search, dev, k, hop_size=k if hops > 1 else None)
        print(name, {m: round(v, 1) for m, v in out[name].items() if isinstance(v, float)})
    (RESULTS / "multihop_dev_base.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
