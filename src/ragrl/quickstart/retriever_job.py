"""`ragrl quickstart` (the default job): what RL adds to a retriever, on held-out questions,
over the full 51k-passage corpus, on a CPU.

  1. dense index of the data kit's corpus from its precomputed MiniLM vectors (cached);
  2. the starting point: the index's own encoder searching as the trained one will (the tiny
     recipe's hops: two hops of 3, the second embedding HARR's history of what the first found),
     on held-out HotpotQA, MuSiQue and 2Wiki questions (evidence recall@6, answer@6 of the 6
     passages the reader is given), and a frozen SmolLM2 answering from those passages (naive RAG);
  3. RL: HARR's retriever policy (`harr_grpo`, tiny): GRPO on the query encoder over two hops of
     Plackett–Luce draws, reward = evidence recall of the drawn documents (+ 0.5 if one holds the
     answer), training on the dev-pool questions (`multihop-train`), evaluated every 50 steps on
     questions of every held-out family held apart (`multihop-dev`), which alone chooses the
     encoder kept (`keep_best: answer_at_k`);
  4. the same held-out evaluation with the kept encoder; paired differences against step 2, per
     set and pooled over all held-out questions, with diagnostics: answer passages gained and lost
     by question kind, and the hop that first brought a gold passage and the answer;
  5. curves and reports, and view.html: per held-out question, both encoders' passages side by
     side (retrieval_per_question.jsonl, the same page as `ragrl view`).

No held-out question takes part in training or in choosing anything. Downstream answers are
re-generated only for questions whose passages changed: the generator decodes greedily, so the
same passages give the same prompt and the same answer.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from ragrl.eval.batches import SEARCH_BATCH, in_batches
from ragrl.eval.cells import ci_cell, diff_cell
from ragrl.eval.harness import EvalConfig, evaluate, score
from ragrl.eval.plots import line_plot
from ragrl.eval.retrieval import by_question_kind, compare_retrievers, compare_rows, format_comparison, load_held_out
from ragrl.eval.retriever_view import ROWS_FILE, retrieval_rows, write_retrieval_rows
from ragrl.eval.stats import ci_record, paired_record
from ragrl.eval.viewer import write_view
from ragrl.methods.base import method_for, settings_of
from ragrl.policy.lm_model import build_policy
from ragrl.policy.model_config import engine_for
from ragrl.quickstart.agent_job import fresh_run_config, say_if_cut
from ragrl.train.run_dir import read_metrics
from ragrl.train.trackers import report_files
from ragrl.train.trainer import Trainer

console = Console()
FINAL_EVAL_S = 90    # the held-out retrieval evaluation after RL and the report


def naive_rag_answers(engine, search, samples, cfg, reuse: dict | None = None) -> dict:
    """Naive RAG with the frozen generator over `search`'s top k; {id: trajectory}. Questions
    whose top-k ids equal those in `reuse` keep reuse's trajectory (greedy: same prompt, same answer)."""

    found = in_batches(samples, SEARCH_BATCH, lambda batch: search([x["question"] for x in batch], cfg.rollout.topk))
    hits = {str(q["id"]): [h.id for h in hs] for q, hs in zip(samples, found)}
    todo = [q for q in samples if reuse is None or reuse[str(q["id"])][0] != hits[str(q["id"])]]
    out = {} if reuse is None else {k: v for k, v in reuse.items() if k not in {str(q["id"]) for q in todo}}

    if todo:
        ecfg = EvalConfig(systems=["naive_rag"], n=len(todo), topk=cfg.rollout.topk, seed=cfg.seed)
        res = evaluate(engine, SimpleNamespace(search=search), todo, ecfg)["naive_rag"]["trajectories"]
        for q, t in zip(todo, res):
            out[str(q["id"])] = (hits[str(q["id"])], t)
    return out


def qa_scores(per_q: dict, ids: list[str]) -> dict:
    rows = {}
    for i in ids:
        t = per_q[i][1]
        score(t)
        rows[i] = {k: float(t.metrics[k]) for k in ("em", "f1", "cover_em")}
    return rows


def diagnostics(qs: list[dict], comp: dict, k: int, hops: int, record: dict) -> list[str]:
    """Report lines that make a regression visible: recall and answer@k by question kind with the
    questions gained and lost, and with several hops which hop first found a gold passage / the answer."""
    pq_base, pq_rl = comp["base encoder"]["per_question"], comp["RL encoder"]["per_question"]
    lines = []
    for key, label in (("recall", f"gold recall@{k}"), ("answer_at_k", f"answer@{k}")):
        kinds = by_question_kind(qs, pq_base, pq_rl, key)
        record[f"{key}_by_kind"] = kinds
        if kinds:
            lines.append(f"By question kind, {label} base → RL (questions gained / lost): " + "; ".join(
                f"{x['kind']} (n={x['n']}) {x['base']:.1f} → {x['new']:.1f} (+{x['gained']} / −{x['lost']})"
                for x in kinds) + ".")
    if hops > 1:
        for key, what in (("gold_hop", "a gold passage"), ("answer_hop", "the answer")):
            shares = {system: [comp[system].get(f"{key}{h}", 0.0) for h in range(1, hops + 1)]
                      for system in ("base encoder", "RL encoder")}
            record[f"first_{key}"] = shares
            order = " / ".join(f"hop {h}" for h in range(1, hops + 1))
            lines.append(f"Hop that first brought {what} (share of questions, {order}): " + "; ".join(
                f"{system} " + " / ".join(f"{v:.1f}" for v in vals) for system, vals in shares.items()) + ".")
    return lines


def run_retriever_quickstart(out_dir: str = "runs/quickstart", overrides: list[str] | None = None,
                             minutes: float | None = 45.0, downstream_n: int = 20,
                             test_sets: dict[str, str] | None = None, held_out_n: int | None = None) -> dict:
    """The main job (see the module docstring). RL trains the tiny recipe's fixed `steps` (the count
    its settings were chosen at, on multihop-dev: experiments/README.md, "Multi-hop selection"), so
    the same seed gives the same table on any machine. `minutes` is only a safety bound on the whole
    job (None: none): RL starts no step past what the other stages leave, and a cut run says so
    loudly. `held_out_n` keeps the first N questions of each held-out set (None: all; a short run)."""
    t_start = time.perf_counter()
    out = Path(out_dir)
    cfg = fresh_run_config("harr_grpo", out, overrides)
    console.rule("[bold]ragrl quickstart: RL on the retriever (HARR), full 51k-passage corpus")
    console.print("1/5 dense index of the data kit's corpus (precomputed MiniLM vectors), query encoder, test sets")
    tests = {name: qs[:held_out_n] for name, qs in load_held_out(test_sets).items()}
    trainer = Trainer(cfg)
    method = method_for(cfg.agent, cfg.policy)
    rc = settings_of(cfg, method)   # the retriever policy's own settings
    dense = trainer.setup.extras["sampler"].index
    # The starting point searches exactly as the trained encoder will, and as `ragrl compare` and
    # `ragrl eval --run` evaluate a retriever run (its method record's eval_retriever): the same hops,
    # history and passages per hop; only the encoder differs (the index's own, frozen).
    base_search = method.eval_retriever(cfg, None, dense).searcher(rc.hops)   # the trainer's index, not a reload
    k, hop_size = cfg.rollout.topk * rc.hops, (cfg.rollout.topk if rc.hops > 1 else None)
    console.print(f"    {len(dense)} passages; {rc.hops} hop(s) of {cfg.rollout.topk} passages"
                  + (" with HARR's history" if rc.hops > 1 and rc.history else "") + f", the reader is given {k}; test: "
                  + ", ".join(f"{name} {len(v)}" for name, v in tests.items()))

    console.print("2/5 starting point: retrieval and naive RAG (frozen SmolLM2) with the index's encoder")
    gen_cfg = replace(cfg.model, lora=False, init_adapter=None)
    lm, tok, _ = build_policy(gen_cfg)
    engine = engine_for(cfg.model, lm, tok, max_batch_size=32)
    down_samples = {name: qs[:downstream_n] for name, qs in tests.items()}
    t0 = time.perf_counter()
    base_down = {name: naive_rag_answers(engine, base_search, qs, cfg) for name, qs in down_samples.items()}
    base_gen_s = time.perf_counter() - t0
    console.print(f"    naive RAG on {sum(map(len, down_samples.values()))} questions in {base_gen_s:.0f} s")

    budget = None
    if minutes is not None:
        # The safety bound leaves time for the final evaluation (it re-generates only the changed
        # questions: at most as long as the first) and the report.
        budget = max(60.0, minutes * 60 - (time.perf_counter() - t_start) - base_gen_s - FINAL_EVAL_S)
    console.print(f"3/5 RL: harr_grpo (tiny) on {cfg.data.train}, best kept on {cfg.data.eval} (held apart): "
                  f"{cfg.steps} steps" + (f" (safety bound {budget / 60:.1f} min)" if budget else ""))
    rows = trainer.train(resume=False, time_budget_s=budget)
    cut = say_if_cut(trainer, len(rows))
    best_dir = out / "rl" / "best_encoder"
    best = json.loads((out / "rl" / "best.json").read_text()) if (out / "rl" / "best.json").exists() else None
    kept = best_dir if best else out / "rl" / "final_encoder"
    console.print(f"    {len(rows)} steps ({len(rows) * cfg.questions_per_step * cfg.rollout.n} sampled retrievals); kept "
                  + (f"the encoder of step {best['step']} ({cfg.data.eval} {best['metric']} {best['value']:.1f})" if best else "the final encoder"))

    console.print("4/5 held-out evaluation with the trained encoder")
    trained_search = method.eval_retriever(cfg, kept, dense).searcher(rc.hops)
    report: dict = {"settings": {"corpus": "data kit corpus/wiki_passages (51,185 passages)", "index": "dense MiniLM, faiss flat",
                                 "k": k, "hops": rc.hops, "history": rc.history, "train": cfg.data.train, "dev (held apart)": cfg.data.eval,
                                 "steps": cfg.steps, "steps_trained": len(rows), "cut_by_time_bound": cut is not None,
                                 "seed": cfg.seed, "kept": str(kept), "best": best, "generator": cfg.model.name,
                                 "minutes": (time.perf_counter() - t_start) / 60}, "sets": {}}
    md = ["# ragrl quickstart: before / after RL on the retriever", "", *([f"**{cut}**", ""] if cut else []),
          f"Held-out questions, dense retrieval over the full {len(dense):,}-passage corpus, {k} passages given to "
          f"the reader ({rc.hops} hop(s) of {cfg.rollout.topk}" + (", later hops with HARR's history" if rc.hops > 1 and rc.history else "")
          + "; the base encoder searches the same way). "
          f"RL: {len(rows)} GRPO steps on {cfg.data.train}; the encoder kept was chosen on {cfg.data.eval} only. "
          "95% bootstrap CIs; Δ is the paired difference against the starting encoder, p one-sided.", ""]
    per_set_rows: list[dict] = []
    view_rows: list[dict] = []   # per question, each encoder's passages: retrieval_per_question.jsonl, view.html
    for name, qs in tests.items():
        hits: dict = {}
        comp = compare_retrievers({"base encoder": base_search, "RL encoder": trained_search}, qs,
                                  cfg.rollout.topk, baseline="base encoder", hop_size=hop_size, hits_out=hits)
        per_set_rows.append({system: comp[system]["per_question"] for system in ("base encoder", "RL encoder")})
        view_rows += retrieval_rows(qs, hits, per_set_rows[-1], set_name=name, hop_size=hop_size)
        down = naive_rag_answers(engine, trained_search, down_samples[name], cfg, reuse=base_down[name])
        ids = [str(q["id"]) for q in down_samples[name]]
        qa_base, qa_rl = qa_scores(base_down[name], ids), qa_scores(down, ids)
        qa = {}
        for key in ("em", "f1"):
            a, b = [qa_base[i][key] for i in ids], [qa_rl[i][key] for i in ids]
            qa[key] = {"base": ci_record(a), "rl": ci_record(b), "diff": paired_record(a, b)}
        changed = sum(down[i][0] != base_down[name][i][0] for i in ids)
        slim = {k: ({m: x for m, x in v.items() if m != "per_question"} if k in ("base encoder", "RL encoder") else v)
                for k, v in comp.items()}
        report["sets"][name] = {"retrieval": slim,
                                "naive_rag": qa, "downstream_n": len(ids), "downstream_regenerated": changed}
        md.append(format_comparison(comp, ["base encoder", "RL encoder"], "base encoder", f"{name} ({len(qs)} questions)"))
        ch = comp["changed"]["RL encoder"]
        pq_base, pq_rl = comp["base encoder"]["per_question"], comp["RL encoder"]["per_question"]
        n_changed = sum(pq_base[i]["hits"] != pq_rl[i]["hits"] for i in pq_base)
        report["sets"][name]["top_k_changed"] = n_changed
        md.append(f"RL changed the {k} passages of {n_changed} of {len(qs)} questions; "
                  f"gold passage recall rose on {ch['recall']['gained']} and fell on {ch['recall']['lost']}"
                  + (f"; answer@{k} gained {ch['answer_at_k']['gained']}, lost {ch['answer_at_k']['lost']}."
                     if "answer_at_k" in ch else "."))
        md += diagnostics(qs, comp, k, rc.hops, report["sets"][name])
        md += ["", f"Naive RAG with the frozen generator on the first {len(ids)} ({changed} re-generated):", "",
               "| metric | base encoder | RL encoder | Δ [95% CI], p |", "|---|---|---|---|"]
        for key in ("em", "f1"):
            r = qa[key]
            md.append(f"| {key.upper()} | {ci_cell(r['base'])} | {ci_cell(r['rl'])} | {diff_cell(r['diff'], with_p=True)} |")
        md.append("")
    if len(tests) > 1:
        # The primary endpoint, fixed before any held-out run: evidence recall@k over every held-out
        # question, pooled (each question counts once; the sets' own rows above are secondary).
        every = [q for qs in tests.values() for q in qs]
        # pooled from the sets' per-question rows (each question counts once; nothing searched again)
        comp = compare_rows({system: {i: row for rows in per_set_rows for i, row in rows[system].items()}
                             for system in ("base encoder", "RL encoder")}, "base encoder", hop_size)
        report["pooled"] = {"sets": list(tests), "paired": comp["paired"], "changed": comp["changed"],
                            **{k: {m: x for m, x in comp[k].items() if m != "per_question"}
                               for k in ("base encoder", "RL encoder")}}
        md.append(format_comparison(comp, ["base encoder", "RL encoder"], "base encoder",
                                    f"all held-out questions, pooled ({len(every)}: " + ", ".join(tests) + ")"))
        md += diagnostics(every, comp, k, rc.hops, report["pooled"]) + [""]
        if any(q.get("gold_source") == "heuristic_evidence" for q in every):
            md += ["2Wiki has no official supporting passages in the kit: its recall is over the kit's heuristic "
                   "evidence passages (the entity's passage and the nearby one holding the answer).", ""]
    console.print("5/5 report and curves")
    metrics = read_metrics(out / "rl")
    line_plot(metrics, ["reward_mean", "gold_recall", "flat_group_frac"], out / "training_curves.png", smooth=0.9)
    line_plot(metrics, ["eval/recall", "eval/answer_at_k"], out / "dev_curve.png")
    md += [f"Curves: `training_curves.png` (train reward, raw and EMA 0.9), `dev_curve.png` (held-apart recall@{k} / "
           f"answer@{k} every 50 steps, with 95% CIs).", ""]
    (out / "before_after.md").write_text("\n".join(md))
    (out / "before_after.json").write_text(json.dumps(report, indent=1))
    report_files(out / "rl", cfg.report_to, [out / f for f in ("before_after.md", "before_after.json",
                                                               "training_curves.png", "dev_curve.png")])
    write_retrieval_rows(out / ROWS_FILE, view_rows)
    view = write_view(out)
    console.rule("[bold]before / after (held-out questions, full corpus)")
    console.print("\n".join(md))
    console.print(f"total {time.perf_counter() - t_start:.0f} s; reports and plots in {out}/")
    console.print(f"per-question view (base vs RL top {k} side by side): {view}", soft_wrap=True)
    return report

