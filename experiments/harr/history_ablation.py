"""HARR's own ablation, trained (issue #41): history against no history, both trained with two hops.

    .venv/bin/python -m experiments.harr.history_ablation \
        --history runs/mh_2hop_history_w2.0 --no-history runs/mh_2hop_nohistory_w2.0

Each run is evaluated as it was trained (2 hops of 3; the history run embeds the question and what
hop 1 found, the other the question alone), and so is its own starting point (the base encoder
searching the same way). On the held-out sets where the paper says history matters: MuSiQue dev
(100) and the bridge questions of HotpotQA dev; the other kinds and 2Wiki are reported too.
Per system: evidence recall@6 and answer@6 with 95% CIs; paired differences history − no history
(trained), and each trained system against its own base. Writes
experiments/harr/results/history_ablation.{json,md}. Nothing here chooses anything.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", required=True, help="the run trained with history (its best_encoder is used)")
    ap.add_argument("--no-history", required=True, help="the run trained without history")
    ap.add_argument("--out", default=str(RESULTS / "history_ablation"))
    args = ap.parse_args()

    from ragrl.eval.cells import ci_cell, diff_cell, write_results
    from ragrl.eval.retrieval import load_held_out, paired_rows, question_kind, retrieval_eval, summary_ci
    from ragrl.methods.harr.setup import load_dense_backend
    from ragrl.retrieval.stochastic import multi_hop_searcher
    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.train.config import TrainConfig
    from ragrl.yaml_config import load_config

    runs = {"history": Path(args.history), "no history": Path(args.no_history)}
    cfgs = {name: load_config(TrainConfig, run / "config.yaml") for name, run in runs.items()}
    rc = {name: c.retriever for name, c in cfgs.items()}
    if not rc["history"].history or rc["no history"].history or rc["history"].hops != rc["no history"].hops:
        raise SystemExit("--history must be a run with retriever.history true and --no-history one with false, "
                         "with the same hops")
    dense = load_dense_backend(cfgs["history"])
    k, hops = cfgs["history"].rollout.topk, rc["history"].hops
    base_encoder = QueryEncoder(rc["history"].encoder)
    systems = {}
    for name, run in runs.items():
        trained = QueryEncoder(str(run / "best_encoder"))
        for label, encoder in ((f"{name}, trained", trained), (f"{name}, base", base_encoder)):
            systems[label] = multi_hop_searcher(dense, encoder, rc[name])
    tests = load_held_out()
    slices = {"MuSiQue dev": tests["musique_dev"],
              "HotpotQA dev, bridge": [q for q in tests["hotpotqa_dev"] if question_kind(q) == "bridge"],
              "HotpotQA dev, comparison": [q for q in tests["hotpotqa_dev"] if question_kind(q) == "comparison"],
              "2Wiki dev": tests["2wikimultihopqa_dev"]}
    result = {"settings": {"runs": {n: str(r) for n, r in runs.items()}, "hops": hops, "k_per_hop": k,
                           "passages": k * hops, "history_words": rc["history"].history_words,
                           "corpus_passages": len(dense)}, "slices": {}}
    n_passages = k * hops
    md = [f"# HARR's history ablation, trained: {hops} hops of {k}", "",
          f"Held-out questions, dense MiniLM over the full {len(dense):,}-passage corpus; each encoder searches as it was "
          "trained. 95% bootstrap CIs; Δ paired over the same questions.", "",
          f"| slice (n) | system | recall@{n_passages} | answer@{n_passages} |", "|---|---|---|---|"]
    pairs = [("no history, trained", "history, trained"), ("history, base", "history, trained"),
             ("no history, base", "no history, trained")]
    for slice_name, qs in slices.items():
        evals = {name: retrieval_eval(fn, qs, k, per_question=True, hop_size=k) for name, fn in systems.items()}
        entry = result["slices"][slice_name] = {
            "n": len(qs), "systems": {n: {m: v for m, v in e.items() if m != "per_question"} for n, e in evals.items()},
            "paired": {f"{b} − {a}": paired_rows(evals[a]["per_question"], evals[b]["per_question"])[0]
                       for a, b in pairs}}
        for name, e in entry["systems"].items():
            cells = [ci_cell(summary_ci(e, m)) if m in e else "–" for m in ("recall", "answer_at_k")]
            md.append(f"| {slice_name} ({len(qs)}) | {name} | " + " | ".join(cells) + " |")
        for label, diffs in entry["paired"].items():
            cells = [diff_cell(d) if (d := diffs.get(m)) else "–" for m in ("recall", "answer_at_k")]
            md.append(f"| {slice_name} ({len(qs)}) | Δ {label} | " + " | ".join(cells) + " |")
    write_results(args.out, result, md)
    print(json.dumps({s: e["paired"] for s, e in result["slices"].items()}, indent=1)[:2000])


if __name__ == "__main__":
    main()
