"""SmartRAG on a CPU: accuracy against retrieval rate for direct, naive RAG, SFT and SFT + PPO.

    .venv/bin/python -m experiments.smartrag.smartrag_frontier --sft runs/smartrag_c0.2/sft/adapter \\
        --ppo 0.2=runs/smartrag_c0.2/final_adapter --ppo 0.5=runs/smartrag_c0.5/final_adapter

Held-out questions (the first --n of each eval file: HotpotQA dev and PopQA test), BM25 over the
full 51k-passage corpus, greedy decoding, SmolLM2-135M. Writes experiments/smartrag/results/smartrag_frontier.{json,md,png}:
EM / F1 / cover-EM with 95% CIs, retrieval rate (share of questions with at least one search)
and searches per question, paired differences of each PPO run against its SFT start and against
naive RAG, and the frontier plot (F1 against retrieval rate, the two baselines marked).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragrl.eval.cache import Cache, adapter_digest

RESULTS = Path(__file__).resolve().parent / "results"
SETS = {"hotpotqa_dev": "kit:eval/hotpotqa_dev.jsonl.gz", "popqa_test": "kit:eval/popqa_test.jsonl.gz"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft", required=True, help="the SFT adapter both PPO runs started from")
    ap.add_argument("--ppo", action="append", default=[], help="COST=ADAPTER_DIR (repeatable)")
    ap.add_argument("--n", type=int, default=150, help="questions per eval set")
    ap.add_argument("--thresholds", default="", help="comma list: also run one policy in SmartRAG's inference "
                                                      "mode (search when P(search) > threshold) at these thresholds")
    ap.add_argument("--threshold-on", default="", help="that policy: SFT or a PPO run's COST (default: the last --ppo)")
    ap.add_argument("--out", default=str(RESULTS / "smartrag_frontier"))
    args = ap.parse_args()
    for spec in args.ppo:
        if "=" not in spec or not Path(spec.split("=", 1)[1], "adapter_config.json").is_file():
            ap.error(f"--ppo {spec!r}: expected COST=ADAPTER_DIR with adapter_config.json in the folder")

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from peft import PeftModel

    from ragrl.datasets import load_questions
    from ragrl.eval.harness import EvalConfig, evaluate
    from ragrl.eval.stats import summarize
    from ragrl.models.lm_weights import load_policy
    from ragrl.policy.lm_model import torch_dtype
    from ragrl.rollout.multi_turn import RolloutConfig
    from ragrl.engines.hf import HFEngine
    from ragrl.train.config import TrainConfig
    from ragrl.train.setup import default_retriever

    retriever = default_retriever(TrainConfig(data=_data("kit:corpus/wiki_passages.jsonl.gz")))
    rollout = RolloutConfig(max_turns=3, max_searches=2, max_turn_tokens=40, max_response_tokens=288,
                            max_obs_tokens=160, passage_words=30, topk=3)
    # bf16 where this hardware computes it natively, else fp32 (emulated bf16 is 2-3x slower)
    dtype = torch_dtype("auto")
    base, tok = load_policy("smollm2-135m-instruct", dtype=dtype)
    adapters = {"SFT": args.sft, **{f"SFT + PPO (cost {c})": d for c, d in (p.split("=", 1) for p in args.ppo)}}
    last = list(adapters)[-1]   # the policy --thresholds runs
    if args.threshold_on:
        last = "SFT" if args.threshold_on == "SFT" else f"SFT + PPO (cost {args.threshold_on})"
        if last not in adapters:
            raise SystemExit(f"--threshold-on {args.threshold_on}: no such system; have {', '.join(adapters)}")
    # peft adapter names may not hold dots or spaces: a slot per system
    slot = {name: f"a{i}" for i, name in enumerate(adapters)}
    model = PeftModel.from_pretrained(base, adapters["SFT"], adapter_name=slot["SFT"])
    for name, path in adapters.items():
        if name != "SFT":
            model.load_adapter(path, adapter_name=slot[name])
    engine = HFEngine(model, tok, max_batch_size=32)
    pooled: dict[str, dict] = {}   # system -> {set:question: scores}, both sets together
    result: dict = {"settings": {"n": args.n, "dtype": str(dtype), "adapters": adapters, "index": "bm25 over the full corpus",
                                 "rollout": rollout.__dict__}, "sets": {}}
    for set_name, path in SETS.items():
        samples = load_questions(path, limit=args.n)
        cache = Cache(Path(args.out).with_suffix(".cache") / set_name, args.n,
                      {**rollout.__dict__, "dtype": str(dtype)})
        summaries: dict = {}

        def run(name: str, adapter_key: str, fn) -> None:
            """Evaluate one system unless the cache already holds it (same adapter bytes, n and rollout)."""
            s = cache.get(name, adapter_key)
            if s is None:
                r = fn()
                s = summarize(r["trajectories"], r["wall_s"], per_question=True)
                for t in r["trajectories"]:   # retrieval as a per-question score, so it pairs like EM and F1
                    s["per_question"][t.sample_id]["retrieved"] = float(t.num_searches > 0)
                rows = s["per_question"].values()
                s["retrieval_rate"] = 100 * sum(row["retrieved"] for row in rows) / len(rows)
                cache.put(name, adapter_key, s)
            summaries[name] = s

        def baselines(system: str):
            with model.disable_adapter():
                res = evaluate(engine, retriever, samples, EvalConfig(agent="smartrag", systems=[system],
                                                                     n=len(samples), topk=3, rollout=rollout))
            return res[system]

        def policy(name: str, th: float | None = None):
            model.set_adapter(slot[name])
            eng = engine
            if th is not None:
                from ragrl.rollout.protocol import get_protocol
                from ragrl.methods.smartrag.threshold_engine import ThresholdDecisionEngine

                proto = get_protocol("smartrag")
                eng = ThresholdDecisionEngine(engine, proto.query[0], proto.answer[0], th)
            res = evaluate(eng, retriever, samples, EvalConfig(agent="smartrag", systems=["agent"], n=len(samples),
                                                              topk=3, rollout=rollout))
            return res["smartrag"]

        for system in ("direct", "naive_rag"):
            run(system, "base", lambda system=system: baselines(system))
        for name, path in adapters.items():
            run(name, adapter_digest(path), lambda name=name: policy(name))
        for th in [float(x) for x in args.thresholds.split(",") if x.strip()]:
            run(f"{last}, threshold {th}", adapter_digest(adapters[last]), lambda th=th: policy(last, th))
        for name, s in summaries.items():
            for sid, row in s["per_question"].items():
                pooled.setdefault(name, {})[f"{set_name}:{sid}"] = row
        result["sets"][set_name] = {"systems": summaries, "paired": _pairs(summaries_pq(summaries))}
        for s in summaries.values():
            s.pop("per_question")
        Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    result["pooled"] = {"n": sum(len(v) for v in list(pooled.values())[:1]), "paired": _pairs(pooled)}
    Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = ["# SmartRAG frontier (held-out, BM25 over the full 51k-passage corpus, greedy)", ""]
    fig = Figure(figsize=(10, 4))
    for i, (set_name, r) in enumerate(result["sets"].items()):
        md += [f"## {set_name} (first {args.n})", "", "| system | EM | F1 | retrieval rate % | searches/q | format errors |",
               "|---|---|---|---|---|---|"]
        ax = fig.add_subplot(1, len(result["sets"]), i + 1)
        for name, s in r["systems"].items():
            md.append(f"| {name} | {s['em']['mean']:.1f} [{s['em']['ci_lo']:.1f}, {s['em']['ci_hi']:.1f}] | "
                      f"{s['f1']['mean']:.1f} [{s['f1']['ci_lo']:.1f}, {s['f1']['ci_hi']:.1f}] | {s['retrieval_rate']:.0f} | "
                      f"{s['searches_per_q']:.2f} | {100 * s['format_error_rate']:.0f}% |")
            marker = "s" if name in ("direct", "naive_rag") else "o"
            ax.errorbar([s["retrieval_rate"]], [s["f1"]["mean"]], yerr=[[s["f1"]["mean"] - s["f1"]["ci_lo"]],
                        [s["f1"]["ci_hi"] - s["f1"]["mean"]]], fmt=marker, capsize=3, label=name)
        md += _paired_table(r["paired"])
        ax.set_xlabel("retrieval rate (% of questions)")
        ax.set_ylabel("F1 (95% CI)")
        ax.set_title(set_name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    md += [f"## both sets pooled ({result['pooled']['n']} questions)", ""] + _paired_table(result["pooled"]["paired"])
    fig.tight_layout()
    FigureCanvasAgg(fig)
    fig.savefig(Path(args.out).with_suffix(".png"), dpi=100)
    md += _training_curves(args.ppo, Path(args.out))
    Path(args.out).with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))


def summaries_pq(summaries: dict) -> dict:
    return {name: s["per_question"] for name, s in summaries.items()}


def _pairs(per_question: dict[str, dict]) -> dict:
    """Each PPO system against its SFT start and against naive RAG: EM, F1 and retrieval rate."""
    from ragrl.eval.stats import paired_bootstrap_diff, paired_diffs

    out = {}
    for name in per_question:
        if not name.startswith("SFT + PPO"):
            continue
        for base in ("SFT", "naive_rag"):
            a, b = per_question[base], per_question[name]
            d = paired_diffs(a, b)
            shared = sorted(set(a) & set(b))
            diff, lo, hi, p = paired_bootstrap_diff([a[k]["retrieved"] for k in shared],
                                                    [b[k]["retrieved"] for k in shared])
            d["retrieved"] = {"diff": 100 * diff, "ci_lo": 100 * lo, "ci_hi": 100 * hi, "p_value": p}
            out[f"{name} - {base}"] = d
    return out


def _paired_table(pairs: dict) -> list[str]:
    from ragrl.eval.stats import format_p

    def cell(d):
        return f"{d['diff']:+.1f} [{d['ci_lo']:+.1f}, {d['ci_hi']:+.1f}]"
    md = ["", "| paired | ΔEM [95% CI] | ΔF1 [95% CI], p | Δretrieval rate [95% CI] |", "|---|---|---|---|"]
    for name, d in pairs.items():
        md.append(f"| {name} | {cell(d['em'])} | {cell(d['f1'])}, p {format_p(d['f1']['p_value'])} | "
                  f"{cell(d['retrieved'])} |")
    return md + [""]


def _training_curves(ppo: list[str], out: Path) -> list[str]:
    """Searches per episode and EM + F1 over PPO steps, one line per cost, read from each run's
    metrics.jsonl (the run dir holding the adapter); a table of the last 10 steps' means."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = {}
    for spec in ppo:
        cost, adapter = spec.split("=", 1)
        metrics = Path(adapter).resolve().parent / "metrics.jsonl"
        if metrics.is_file():
            by_step = {}
            for line in metrics.read_text().splitlines():
                row = json.loads(line)
                by_step[row["step"]] = row   # a resumed run logs a step again: keep the last
            runs[cost] = [by_step[k] for k in sorted(by_step)]
    if not runs:
        return []
    fig = Figure(figsize=(10, 3.5))
    md = ["## training (each run's metrics.jsonl; 8 questions x 2 samples a step)", "",
          "| cost | steps | searches/episode, first 5 steps | last 10 steps | EM + F1, first 5 | last 10 |",
          "|---|---|---|---|---|---|"]
    for i, (key, title) in enumerate([("searches", "searches per episode"), ("em_f1", "EM + F1 (training batch)")]):
        ax = fig.add_subplot(1, 2, i + 1)
        for cost, rows in runs.items():
            ys = [r["em"] + r["f1"] if key == "em_f1" else r[key] for r in rows]
            ema, acc = [], ys[0]
            for y in ys:   # smoothed: a step is only 16 episodes
                acc = 0.8 * acc + 0.2 * y
                ema.append(acc)
            ax.plot([r["step"] for r in rows], ema, label=f"cost {cost}")
        ax.set_title(title + " (EMA 0.8)")
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for cost, rows in runs.items():
        def mean(rs, f):
            return sum(f(r) for r in rs) / len(rs)
        md.append(f"| {cost} | {len(rows)} | {mean(rows[:5], lambda r: r['searches']):.2f} | "
                  f"{mean(rows[-10:], lambda r: r['searches']):.2f} | {mean(rows[:5], lambda r: r['em'] + r['f1']):.3f} | "
                  f"{mean(rows[-10:], lambda r: r['em'] + r['f1']):.3f} |")
    fig.tight_layout()
    FigureCanvasAgg(fig)
    fig.savefig(out.with_name(out.name + "_training.png"), dpi=100)
    return md + [""]


def _data(corpus: str):
    from ragrl.train.config import DataConfig
    return DataConfig(corpus=corpus)


if __name__ == "__main__":
    main()
