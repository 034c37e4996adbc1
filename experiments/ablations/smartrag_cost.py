"""SmartRAG's claim as an ablation (issue #58): a cost per retrieval teaches the policy to retrieve only
where retrieval pays, at equal accuracy.

One SFT start (`smartrag_ppo --variant tiny`), then PPO from it at each cost, identical but for the
cost: the variant's fixed 40 steps, seed 0. Then `ragrl compare` of every arm on held-out questions
(BM25 over the full corpus, greedy), and the ablation's own table from the comparison's per-question
episodes:
- per arm: retrieval rate (share of questions with a search), F1, and selectivity (retrieval rate on
  the questions where retrieval pays minus the rate on the rest; a question pays when direct,
  closed-book, scores F1 0 and naive RAG's top 3 shows a gold answer), each with a 95% bootstrap CI
  (selectivity's resamples each group within itself, since the label is fixed per question);
- paired, against the SFT start and against the cost-0 arm: ΔF1, Δretrieval rate, Δselectivity;
- the verdict the rule in experiments/README.md fixed before the runs; the frontier plot.
A finished arm is reused and a killed one resumed, so the command can be run again. The rule's fifth
cost, if any, is passed with --costs.

    .venv/bin/python -m experiments.ablations.smartrag_cost
    .venv/bin/python -m experiments.ablations.smartrag_cost --costs 0 0.02 0.05 0.1 0.035
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import numpy as np
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from experiments.ablations.common import compare, held_apart, keep_run_files, train_start_and_arms  # noqa: E402
from ragrl.cli.console import setup_console  # noqa: E402
from ragrl.compare.read import POOLED, episodes, question_sets  # noqa: E402
from ragrl.eval.cells import ci_cell, diff_cell, markdown_table, write_results  # noqa: E402
from ragrl.eval.stats import ci_record, paired_record  # noqa: E402

RECIPE, VARIANT = "smartrag_ppo", "tiny"
COSTS = (0.0, 0.02, 0.05, 0.1)
DATA = ("kit:eval/popqa_test.jsonl.gz", "kit:eval/hotpotqa_dev.jsonl.gz")
MARGIN_F1 = 2.0   # the rule's "equal accuracy": ΔF1's CI lower end at or above -2 points


def arm_name(cost: float) -> str:
    """The arm's run folder name.

    >>> arm_name(0.0), arm_name(0.05)
    ('cost_0', 'cost_0.05')
    """
    return f"cost_{cost:g}"


def fifth_cost(searches: dict[float, float], low: float = 0.2, high: float = 0.8, target: float = 0.5) -> float | None:
    """The rule's fifth cost from each arm's held-apart searches per question: None when some arm is
    already within [low, high] or no two adjacent costs bracket `target`; else their midpoint.

    >>> fifth_cost({0.0: 0.9, 0.02: 0.85, 0.05: 0.1, 0.1: 0.0})
    0.035
    >>> fifth_cost({0.0: 0.9, 0.1: 0.5}) is None, fifth_cost({0.0: 0.1, 0.1: 0.0}) is None
    (True, True)
    """
    if any(low <= v <= high for v in searches.values()):
        return None
    costs = sorted(searches)
    for a, b in zip(costs, costs[1:]):
        if (searches[a] - target) * (searches[b] - target) < 0:
            return round((a + b) / 2, 6)
    return None


def stratified_draws(pays: list[bool], n_boot: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap draws that resample the paying questions among themselves and the rest among
    themselves ([n_boot, n_pays] and [n_boot, n_rest] positions into each group), so every draw keeps
    the groups' sizes: the label is fixed per question, and only the arms' retrieval varies. One set
    of draws serves every arm, which pairs their differences."""
    n_pays = sum(pays)
    if n_pays in (0, len(pays)):
        raise ValueError("selectivity needs questions on both sides of the pays label")
    rng = np.random.default_rng(seed)
    return (rng.integers(0, n_pays, size=(n_boot, n_pays)),
            rng.integers(0, len(pays) - n_pays, size=(n_boot, len(pays) - n_pays)))


def _selectivity_draws(retrieved: list[float], pays: list[bool], draws) -> tuple[float, np.ndarray]:
    r = np.asarray(retrieved, dtype=np.float64)
    mask = np.asarray(pays, dtype=bool)
    on, off = r[mask], r[~mask]
    return float(on.mean() - off.mean()), on[draws[0]].mean(axis=1) - off[draws[1]].mean(axis=1)


def selectivity_record(retrieved: list[float], pays: list[bool], draws) -> dict:
    """The retrieval rate on the paying questions minus the rate on the rest, in points, with its
    95% stratified-bootstrap CI: {mean, ci_lo, ci_hi, n} (`ci_record`'s shape).

    >>> draws = stratified_draws([True, True, False, False], n_boot=50)
    >>> selectivity_record([1, 1, 0, 0], [True, True, False, False], draws)
    {'mean': 100.0, 'ci_lo': 100.0, 'ci_hi': 100.0, 'n': 4}
    """
    point, boot = _selectivity_draws(retrieved, pays, draws)
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return {"mean": 100 * point, "ci_lo": 100 * float(lo), "ci_hi": 100 * float(hi), "n": len(pays)}


def selectivity_diff(a: list[float], b: list[float], pays: list[bool], draws) -> dict:
    """b's selectivity minus a's on the same questions and draws, in points: {diff, ci_lo, ci_hi,
    p_value, n} (`paired_record`'s shape; p one-sided, for "b is not more selective")."""
    pa, ba = _selectivity_draws(a, pays, draws)
    pb, bb = _selectivity_draws(b, pays, draws)
    d = bb - ba
    lo, hi = np.quantile(d, [0.025, 0.975])
    return {"diff": 100 * (pb - pa), "ci_lo": 100 * float(lo), "ci_hi": 100 * float(hi),
            "p_value": (1.0 + float(np.sum(d <= 0))) / (1.0 + d.size), "n": len(pays)}


def train_arms(root: Path, costs: list[float]) -> list[Path]:
    """The SFT start, then each arm; a finished one is skipped, a killed one resumed."""
    sft = root / "sft" / "adapter"
    arms = {arm_name(cost): (RECIPE, [f"model.init_adapter={sft}", f"reward.smartrag.cost={cost}", "eval_every=40"])
            for cost in costs}
    return train_start_and_arms(root, RECIPE, VARIANT, [], arms)


def held_apart_searches(run: Path) -> float:
    """The arm's last held-apart `eval/searches` (the rule's test for a fifth cost)."""
    evals = held_apart(run, ("searches",))
    if not evals:
        raise SystemExit(f"{run}/metrics.jsonl has no eval/searches: was it trained with eval_every=40?")
    return evals[max(evals)]["searches"]


def metrics_of(folder: Path, system: str) -> dict[str, dict]:
    """{question id: episode metrics} of one system in a comparison folder."""
    return {i: t.metrics for i, t in episodes(folder, system).items()}


def retrieved(arm: dict, ids: list[str]) -> list[float]:
    """1 where the arm's episode searched at least once."""
    return [float(arm[i].get("searches", 0) > 0) for i in ids]


def arm_figures(arm: dict, ids: list[str], pays: list[bool], draws) -> dict:
    r = retrieved(arm, ids)
    return {"n": len(ids), "retrieval_rate": ci_record(r), "f1": ci_record([arm[i]["f1"] for i in ids]),
            "selectivity": selectivity_record(r, pays, draws)}


def paired_figures(a: dict, b: dict, ids: list[str], pays: list[bool], draws) -> dict:
    """b − a on the same questions: ΔF1, Δretrieval rate, Δselectivity (points)."""
    ra, rb = retrieved(a, ids), retrieved(b, ids)
    return {"f1": paired_record([a[i]["f1"] for i in ids], [b[i]["f1"] for i in ids]),
            "retrieval_rate": paired_record(ra, rb), "selectivity": selectivity_diff(ra, rb, pays, draws)}


def verdict(vs_cost0: dict[str, dict]) -> str:
    """The rule's verdict from each costed arm's pooled differences against the cost-0 arm.

    >>> d = lambda lo, hi: {"diff": (lo + hi) / 2, "ci_lo": lo, "ci_hi": hi}
    >>> verdict({"cost_0.1": {"retrieval_rate": d(-50, -40), "f1": d(-1.5, 3), "selectivity": d(2, 9)}})
    'reproduced in direction'
    >>> verdict({"cost_0.1": {"retrieval_rate": d(-50, -40), "f1": d(-6, -1), "selectivity": d(2, 9)}})
    'not reproduced'
    >>> verdict({"cost_0.1": {"retrieval_rate": d(-50, -40), "f1": d(-3, 1), "selectivity": d(-2, 9)}})
    'no clear difference'
    """
    less = {k: v for k, v in vs_cost0.items() if v["retrieval_rate"]["ci_hi"] < 0}
    if any(v["f1"]["ci_lo"] >= -MARGIN_F1 and v["selectivity"]["ci_lo"] > 0 for v in less.values()):
        return "reproduced in direction"
    if less and all(v["f1"]["ci_hi"] < 0 or v["selectivity"]["ci_hi"] < 0 for v in less.values()):
        return "not reproduced"
    return "no clear difference"


def ablation(folder: Path, costs: list[float]) -> dict:
    """The ablation's figures, per question set and pooled, from a `ragrl compare` folder."""
    direct, naive = metrics_of(folder, "direct"), metrics_of(folder, "naive_rag")
    names = [arm_name(c) for c in costs]
    arms = {name: metrics_of(folder, name) for name in names}
    start = metrics_of(folder, f"{names[0]} (start)")
    sets = question_sets(folder)
    result = {"compare": str(folder), "costs": costs, "sets": {}}
    for set_name, ids in sets.items():
        pays = [direct[i]["f1"] == 0 and bool(naive[i].get("answer_shown")) for i in ids]
        draws = stratified_draws(pays)
        entry = {"n": len(ids), "paying_questions": sum(pays),
                 "systems": {"direct": arm_figures(direct, ids, pays, draws),
                             "naive RAG": arm_figures(naive, ids, pays, draws),
                             "SFT start": arm_figures(start, ids, pays, draws),
                             **{n: arm_figures(a, ids, pays, draws) for n, a in arms.items()}},
                 "vs_start": {n: paired_figures(start, a, ids, pays, draws) for n, a in arms.items()},
                 "vs_cost_0": {n: paired_figures(arms[names[0]], a, ids, pays, draws)
                               for n, a in arms.items() if n != names[0]}}
        result["sets"][set_name] = entry
    result["verdict"] = verdict(result["sets"][POOLED]["vs_cost_0"])
    return result


def markdown(result: dict) -> list[str]:
    md = ["# SmartRAG's retrieval cost, ablated (issue #58)", "",
          f"Comparison folder: `{result['compare']}`. Verdict (the rule's, pooled): **{result['verdict']}**.", ""]
    for set_name, e in result["sets"].items():
        md += [f"## {set_name} ({e['n']} questions; retrieval pays on {e['paying_questions']})", ""]
        md += markdown_table(["system", "retrieval rate %", "F1", "selectivity (points)"],
                             [[n, ci_cell(s["retrieval_rate"]), ci_cell(s["f1"]), ci_cell(s["selectivity"], signed=True)]
                              for n, s in e["systems"].items()])
        md += [""]
        rows = [[f"{n} − SFT start", diff_cell(d["retrieval_rate"]), diff_cell(d["f1"]), diff_cell(d["selectivity"])]
                for n, d in e["vs_start"].items()]
        rows += [[f"{n} − {arm_name(result['costs'][0])}", diff_cell(d["retrieval_rate"]), diff_cell(d["f1"]),
                  diff_cell(d["selectivity"])] for n, d in e["vs_cost_0"].items()]
        md += markdown_table(["paired", "Δretrieval rate", "ΔF1", "Δselectivity"], rows) + [""]
    return md


def frontier_plot(result: dict, path: Path) -> None:
    """F1 against retrieval rate per arm (and the SFT start), one panel a question set, 95% CIs."""
    sets = result["sets"]
    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.6), squeeze=False)
    for ax, (set_name, e) in zip(axes[0], sets.items()):
        for name, s in e["systems"].items():
            r, f = s["retrieval_rate"], s["f1"]
            ax.errorbar(r["mean"], f["mean"], xerr=[[r["mean"] - r["ci_lo"]], [r["ci_hi"] - r["mean"]]],
                        yerr=[[f["mean"] - f["ci_lo"]], [f["ci_hi"] - f["mean"]]], fmt="o", capsize=3,
                        label=name.replace("cost_", "cost "))
        ax.set(title=f"{set_name} ({e['n']} q)", xlabel="retrieval rate %", ylabel="F1", xlim=(-5, 105))
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("runs/abl/smartrag_cost"), help="where the SFT start and arms train")
    ap.add_argument("--costs", type=float, nargs="+", default=list(COSTS), help="the arms' costs, the first the reference")
    ap.add_argument("--n", type=int, help="the first N questions of each held-out file (default: all)")
    ap.add_argument("--out", type=Path, default=Path("experiments/ablations/results/smartrag_cost"),
                    help="where to write <out>.json, <out>.md and <out>.png")
    args = ap.parse_args()
    setup_console()   # the console `ragrl` shows: its own lines and bars, not the libraries'
    runs = train_arms(args.root, args.costs)
    searches = {c: held_apart_searches(r) for c, r in zip(args.costs, runs)}
    print("held-apart searches per question (smartrag-dev, first 100):", searches)
    extra = fifth_cost(searches)
    if extra is not None and extra not in args.costs:
        print(f"the rule asks for a fifth arm: run again with --costs {' '.join(f'{c:g}' for c in args.costs)} {extra:g}")
    folder = compare(args.root / "compare", runs, DATA, args.n)
    result = ablation(folder, args.costs)
    result["held_apart_searches"] = {arm_name(c): v for c, v in searches.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, result, markdown(result))
    frontier_plot(result, args.out.with_suffix(".png"))
    keep_run_files(args.out, folder, {f"{c:g}": run for c, run in zip(args.costs, runs)})


if __name__ == "__main__":
    main()
