"""MMOA-RAG probe: does the selector's first pick carry any signal beyond the candidate's position?

    .venv/bin/python -m experiments.mmoa.mmoa_selector_logits --part experiments/mmoa/results/mmoa_pooldev_cpu \\
        --sft runs/mmoa_s10/sft/adapter --adapter "I=runs/s16/i/final_adapter"

Every trained selector so far keeps the first documents of its candidate list in retrieval order
(`mmoa_selector_vs_retriever`), so no RL run could show a gain that needs choosing documents.
RL can only amplify what the policy already prefers now and then. This reads, for each question,
the SFT pipeline's own candidates (cached by `mmoa_eval`: no decoding), builds the selector's
prompt as the pipeline does, and scores the first id the selector would write: the distribution
over `Document<d>` after one forward pass (no sampling). Per adapter (the base model, the SFT
start, each --adapter's selector):
- p_first: the mean probability of Document0;
- position-matched gold margin: at each position d >= 1, the mean log-probability of gold
  candidates minus that of non-gold candidates at the same position (pooled over positions,
  weighted by the gold count there), with a 95% bootstrap CI over questions. Above 0: the
  selector prefers gold documents beyond what their position predicts, a signal RL can grow;
- AUC over positions >= 1: how often a gold candidate outranks a non-gold one of the same
  question (0.5 = no signal; BM25's own order, for reference, gives the same statistic by rank).
Writes OUT.json and OUT.md.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from experiments.mmoa.common import SETS, collect
from ragrl.eval.cache import adapter_digest
from ragrl.eval.cells import ci_cell, write_results

RESULTS = Path(__file__).resolve().parent / "results"


def margins(logps: list[list[float]], golds: list[list[bool]]) -> tuple[list[float], float]:
    """(per-question position-matched gold margins, AUC). `logps[q][d]`: log-probability of the
    first pick being candidate d of question q; `golds[q][d]`: whether it is gold. Position 0 is
    left out (the position prior rules there). A question's margin is the mean, over its gold
    candidates at d >= 1, of logp[d] minus the mean logp of the non-gold candidates at d over all
    questions; questions with no gold at d >= 1 are left out. AUC: over same-question pairs
    (gold, non-gold) at d >= 1, how often the gold one scores higher (ties count half).

    >>> m, auc = margins([[0.0, -1.0, -3.0], [0.0, -2.0, -1.0]], [[1, 1, 0], [1, 0, 1]])
    >>> [round(x, 2) for x in m], auc        # non-gold means: d1 -2.0, d2 -3.0
    ([1.0, 2.0], 1.0)
    """
    nongold: dict[int, list[float]] = {}
    for lp, g in zip(logps, golds):
        for d in range(1, len(lp)):
            if not g[d]:
                nongold.setdefault(d, []).append(lp[d])
    mean_ng = {d: sum(v) / len(v) for d, v in nongold.items()}
    per_q, wins, pairs = [], 0.0, 0
    for lp, g in zip(logps, golds):
        gold_d = [d for d in range(1, len(lp)) if g[d] and d in mean_ng]
        if gold_d:
            per_q.append(sum(lp[d] - mean_ng[d] for d in gold_d) / len(gold_d))
        for d in range(1, len(lp)):
            if g[d]:
                for e in range(1, len(lp)):
                    if not g[e]:
                        pairs += 1
                        wins += 1.0 if lp[d] > lp[e] else 0.5 if lp[d] == lp[e] else 0.0
    return per_q, wins / max(1, pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", required=True, help="an mmoa_eval --out whose cache holds the SFT start")
    ap.add_argument("--sft", required=True)
    ap.add_argument("--adapter", action="append", default=[], help="LABEL=ADAPTER_DIR (per-agent: its selector)")
    ap.add_argument("--out", default=str(RESULTS / "mmoa_selector_logits"))
    args = ap.parse_args()

    import torch
    from peft import PeftModel

    from ragrl.methods.mmoa.protocol import MMOAProtocol
    from ragrl.datasets import load_questions, with_heuristic_gold
    from ragrl.eval.stats import bootstrap_ci
    from ragrl.models.lm_weights import load_policy
    from ragrl.paths import resolve_kit
    from ragrl.retrieval.corpus import load_corpus
    from ragrl.rollout.multi_turn import chat_ids
    from ragrl.policy.lm_model import torch_dtype

    summaries, spans, _ = collect([Path(args.part)], {"SFT": adapter_digest(args.sft)})
    (set_name, systems), = summaries.items()
    (lo, hi, _), = spans[set_name]
    rows = with_heuristic_gold(load_questions(SETS[set_name], limit=hi))[lo:hi]
    # A question with under two candidates has no choice to score.
    keep = [i for i, m in enumerate(systems["SFT"]) if len(m["retrieved"]) >= 2]
    rows, cands = [rows[i] for i in keep], [systems["SFT"][i]["retrieved"] for i in keep]
    corpus = load_corpus(resolve_kit("kit:corpus/wiki_passages.jsonl.gz"))
    passages = {pid: corpus.hit(corpus.row(pid), 0.0) for c in cands for pid in c}
    golds = [[pid in set(r["gold_passage_ids"]) for pid in c] for r, c in zip(rows, cands)]

    dtype = torch_dtype("auto")
    base, tok = load_policy("smollm2-135m-instruct", dtype=dtype)
    model = PeftModel.from_pretrained(base, args.sft, adapter_name="sft")
    for i, spec in enumerate(args.adapter):
        label, path = spec.split("=", 1)
        sub = Path(path) / "selector"
        model.load_adapter(str(sub if sub.is_dir() else path), adapter_name=f"a{i}")
    model.eval()
    proto = MMOAProtocol(passage_words=30)   # as mmoa_eval decodes
    doc_tok = tok.encode("Document", add_special_tokens=False)
    digit_tok = [tok.encode(str(d), add_special_tokens=False)[0] for d in range(10)]
    prompts = []
    for r, c in zip(rows, cands):
        prompts.append(chat_ids(tok, proto.selector_messages(r["question"], [passages[p] for p in c])) + doc_tok)

    def first_pick_logps() -> list[list[float]]:
        out = []
        with torch.no_grad():
            for ids, c in zip(prompts, cands):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                lp = torch.log_softmax(logits[digit_tok[: len(c)]], dim=-1)   # over this question's ids
                out.append(lp.tolist())
        return out

    systems_lp = {}
    with model.disable_adapter():
        systems_lp["base model"] = first_pick_logps()
    model.set_adapter("sft")
    systems_lp["SFT"] = first_pick_logps()
    for i, spec in enumerate(args.adapter):
        model.set_adapter(f"a{i}")
        systems_lp[spec.split("=", 1)[0]] = first_pick_logps()
    # BM25's own order as a "selector": log-probability falling with rank (any decreasing scores give the same AUC).
    systems_lp["BM25 order (reference)"] = [[-float(d) for d in range(len(c))] for c in cands]

    result = {"part": args.part, "set": set_name, "n": len(rows), "gold": golds, "systems": {}}
    md = [f"# MMOA selector: first-pick signal beyond position ({set_name}, {len(rows)} questions, SFT's candidates)", "",
          "| selector | P(Document0) | gold margin at d>=1, nats [95% CI] | AUC at d>=1 |", "|---|---|---|---|"]
    for name, lps in systems_lp.items():
        per_q, auc = margins(lps, golds)
        ci = bootstrap_ci(per_q)
        p0 = sum(math.exp(lp[0]) for lp in lps) / len(lps) if name != "BM25 order (reference)" else None
        result["systems"][name] = {"logps": [[round(x, 4) for x in lp] for lp in lps], "p_first": p0, "gold_margin": ci,
                                   "questions_with_gold_after_first": len(per_q), "auc": auc}
        md.append(f"| {name} | {'–' if p0 is None else f'{p0:.3f}'} | {ci_cell(ci, '.2f', signed=True)} | {auc:.3f} |")
    md += ["", f"Questions with a gold candidate after position 0: {len(per_q)}."]
    write_results(args.out, result, md)


if __name__ == "__main__":
    main()
