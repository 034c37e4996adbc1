"""A comparison's run against its start, split by how the start's episode ended (issue #53).

Where a run's F1 moves but its search gain does not, this says where the F1 came from: the questions
whose start answered, or those whose start ran out of turns or tokens without an answer (F1 0 there).
For each group: its size, the start's and the run's F1 with 95% bootstrap CIs, the paired run − start
difference, how often the run answered, and the mean words of each answer given (unanswered episodes
left out of the words). The statistics are `ragrl.eval.stats`'s, the cells `ragrl.eval.cells`'s.
Seconds on a CPU.

    .venv/bin/python -m experiments.leaderboard.by_start_ending --compare runs/leaderboard_learn/r1_searcher_stage2 \\
        --run r1_searcher_stage2 --out experiments/leaderboard/results/r1_searcher_stage2_by_start_ending
"""
from __future__ import annotations

import json
from pathlib import Path

from ragrl.eval.cells import ci_cell, diff_cell, markdown_table, write_results
from ragrl.eval.stats import ci_record, paired_record

from experiments.search_agents.per_set import run_against_start_args


def episodes(folder: Path, system: str) -> dict[str, dict]:
    """The comparison's episode of `system` for each question id: its F1, stop reason and answer."""
    rows = (json.loads(line) for line in (folder / f"trajectories_{system}.jsonl").read_text().splitlines())
    return {r["sample_id"]: {"f1": r["metrics"]["f1"], "stop": r["stop_reason"], "answer": r.get("answer")}
            for r in rows}


def mean_words(answers: list[str | None]) -> float | None:
    words = [len(a.split()) for a in answers if a]
    return round(sum(words) / len(words), 2) if words else None


def by_start_ending(folder: Path, run: str) -> dict:
    trained, start = episodes(folder, run), episodes(folder, f"{run}_start")
    if set(trained) != set(start):
        raise SystemExit(f"{folder}: {run} and {run}_start answered different questions")
    groups: dict[str, list[str]] = {}
    for qid, e in start.items():
        groups.setdefault(e["stop"], []).append(qid)
    groups["all"] = list(start)
    result = {}
    for name, ids in sorted(groups.items(), key=lambda kv: (kv[0] == "all", -len(kv[1]))):
        a, b = [start[i]["f1"] for i in ids], [trained[i]["f1"] for i in ids]
        result[name] = {"n": len(ids), "f1": {"start": ci_record(a), "run": ci_record(b),
                                              "run - start": paired_record(a, b)},
                        "run answered %": round(100 * sum(trained[i]["stop"] == "answer" for i in ids) / len(ids), 1),
                        "answer words": {"start": mean_words([start[i]["answer"] for i in ids]),
                                         "run": mean_words([trained[i]["answer"] for i in ids])}}
    return result


def table(result: dict) -> list[str]:
    rows = [[name, str(e["n"]), ci_cell(e["f1"]["start"]), ci_cell(e["f1"]["run"]), diff_cell(e["f1"]["run - start"]),
             f"{e['run answered %']:.1f}", str(e["answer words"]["start"]), str(e["answer words"]["run"])]
            for name, e in result.items()]
    return markdown_table(["the start's episode ended", "n", "F1: start", "run", "run − start", "run answered %",
                           "answer words: start", "run"], rows)


def main() -> None:
    args = run_against_start_args(__doc__.split("\n\n")[0])
    result = {"compare": str(args.compare), "run": args.run, "groups": by_start_ending(args.compare, args.run)}
    write_results(args.out, result, table(result["groups"]))   # and prints the table


if __name__ == "__main__":
    main()
