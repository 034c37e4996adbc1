"""A comparison's run against its start, set by set (issue #53's `eval/` measurement).

`ragrl compare` pools every `--data` file into one table; a result measured on `eval/` is reported per
set too (HotpotQA, MuSiQue, 2Wiki) and pooled. This reads the comparison folder's questions and the
run's and its start's episodes, and gives for each set and for all: the run's and the start's means with
95% bootstrap CIs, and the run − start paired difference, for F1, answer@shown and the search gain
(yes/no questions have no search gain and are left out of it, as in the comparison's own table). The
statistics are `ragrl.eval.stats`'s, the cells `ragrl.eval.cells`'s. Seconds on a CPU.

    .venv/bin/python -m experiments.search_agents.per_set --compare runs/learn_r_eval --run learn_r \\
        --out experiments/search_agents/results/learn_r_eval_per_set
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ragrl.compare.read import episodes, question_sets
from ragrl.eval.cells import ci_cell, diff_cell, markdown_table, write_results
from ragrl.eval.stats import ci_record, paired_record
from ragrl.rollout.trajectory import Trajectory

METRICS = ("f1", "answer_shown", "search_gain")


def first_query(t: Trajectory) -> str | None:
    """The first query an episode's searches sent (None: it never searched). A pipeline's answering
    episode (MMOA-RAG's generator) holds no search turn: its rewriter's sub-questions, searched in
    order, are in its metrics."""
    searched = next((q for turn in t.turns if turn.kind == "search" for q in turn.queries), None)
    return searched if searched is not None else next(iter(t.metrics.get("subquestions") or []), None)


def per_set(folder: Path, run: str) -> dict:
    trained = {i: t.metrics for i, t in episodes(folder, run).items()}
    start = {i: t.metrics for i, t in episodes(folder, f"{run} (start)").items()}
    result = {}
    for name, ids in question_sets(folder).items():
        entry = {"n": len(ids)}
        for metric in METRICS:
            pairs = [(start[i][metric], trained[i][metric]) for i in ids
                     if start[i].get(metric) is not None and trained[i].get(metric) is not None]
            a, b = [p[0] for p in pairs], [p[1] for p in pairs]
            # f1, answer@shown and the search gain are fractions (the gain in -1..1): points in the table
            entry[metric] = {"start": ci_record(a), "run": ci_record(b), "run - start": paired_record(a, b)}
        result[name] = entry
    return result


LABELS = {"f1": "F1", "answer_shown": "answer@shown", "search_gain": "search gain"}


def table(records: list[dict], metrics: tuple[str, ...] = METRICS) -> list[str]:
    """One row per run and set (`records`: this module's `{"run", "sets"}` records, one per run), with the
    start's, the run's and the paired difference for each metric: this table and the leaderboard's set by
    set section are both written here."""
    rows = [[r["run"], name, str(e["n"]),
             *(cell for m in metrics for cell in (ci_cell(e[m]["start"], signed=m == "search_gain"),
                                                  ci_cell(e[m]["run"], signed=m == "search_gain"),
                                                  diff_cell(e[m]["run - start"])))]
            for r in records for name, e in r["sets"].items()]
    header = ["run", "set", "n", *(h for m in metrics for h in (f"{LABELS[m]}: start", "run", "run − start"))]
    return markdown_table(header, rows)


def run_against_start_args(description: str, runner_searches: bool = False) -> argparse.Namespace:
    """The command line of a script that reads one run and its start from a comparison folder
    (`runner_searches`: with the option naming how many searches the runner wrote first)."""
    ap = argparse.ArgumentParser(description=description)
    if runner_searches:
        ap.add_argument("--runner-searches", type=int, default=0, choices=range(0, 4), metavar="N",
                        help="searches the runner wrote before the policy's first (rollout.first_action: "
                             "question writes 1); the split by first query reads the policy's (0-3, default 0)")
    ap.add_argument("--compare", type=Path, required=True, help="a `ragrl compare` output folder")
    ap.add_argument("--run", required=True, help="the run's row name in it (its start is `<run>_start`)")
    ap.add_argument("--out", type=Path, required=True, help="where to write <out>.json and <out>.md")
    return ap.parse_args()


def main() -> None:
    args = run_against_start_args(__doc__.split("\n\n")[0])
    result = {"compare": str(args.compare), "run": args.run, "sets": per_set(args.compare, args.run)}
    md = table([result])
    write_results(args.out, result, md)   # and prints the table


if __name__ == "__main__":
    main()
