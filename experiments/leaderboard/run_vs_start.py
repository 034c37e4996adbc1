"""Where a comparison's run moved against its start, split two ways (issue #53's remake).

Where a run's F1 or search gain moves, or does not, this says where:
- **by how the start's episode ended** (answered, out of turns, out of tokens; no answer scores F1 0):
  each group's size, the start's and the run's F1 with 95% bootstrap CIs and the paired run − start
  difference, how often the run answered, and the mean words of each answer given;
- **by the first query**, for the start and the run each: episodes whose first query is the question
  word for word (after `ragrl.text.normalize_answer`) against those whose first query rewrote it, with
  their count and search gain (questions with no search gain, yes/no ones, left out). Where the
  runner wrote the first searches (`rollout.first_action: question`), `--runner-searches 1` splits on
  the first query the policy wrote instead, and an episode whose policy never searched is left out.

The statistics are `ragrl.eval.stats`'s, the cells `ragrl.eval.cells`'s. Seconds on a CPU.

    .venv/bin/python -m experiments.leaderboard.run_vs_start --compare runs/leaderboard_learn/r1_searcher_stage2 \\
        --run r1_searcher_stage2 --out experiments/leaderboard/results/r1_searcher_stage2_run_vs_start
    .venv/bin/python -m experiments.leaderboard.run_vs_start --compare runs/learn_ah_judge --run learn_ah \\
        --runner-searches 1 --out experiments/search_agents/results/learn_ah_judge_run_vs_start
"""
from __future__ import annotations

from pathlib import Path

from ragrl.compare.read import episodes
from ragrl.eval.cells import ci_cell, diff_cell, markdown_table, write_results
from ragrl.eval.stats import ci_record, paired_record
from ragrl.rollout.trajectory import Trajectory
from ragrl.text import normalize_answer

from experiments.search_agents.per_set import first_query, run_against_start_args


def mean_words(answers: list[str | None]) -> float | None:
    words = [len(a.split()) for a in answers if a]
    return round(sum(words) / len(words), 2) if words else None


def answered(t: Trajectory) -> bool:
    """The episode gave an answer: a multi-turn episode that ended on its answer tag, or a pipeline's
    generator (MMOA-RAG's, which answers on every question, ending by eos or its token bound)."""
    return bool(t.answer and t.answer.strip())


def by_start_ending(start: dict[str, Trajectory], trained: dict[str, Trajectory]) -> dict:
    groups: dict[str, list[str]] = {}
    for qid, t in start.items():
        groups.setdefault(str(t.stop_reason), []).append(qid)
    groups["all"] = list(start)
    result = {}
    for name, ids in sorted(groups.items(), key=lambda kv: (kv[0] == "all", -len(kv[1]))):
        a, b = [start[i].metrics["f1"] for i in ids], [trained[i].metrics["f1"] for i in ids]
        result[name] = {"n": len(ids), "f1": {"start": ci_record(a), "run": ci_record(b),
                                              "run - start": paired_record(a, b)},
                        "run answered %": round(100 * sum(answered(trained[i]) for i in ids) / len(ids), 1),
                        "answer words": {"start": mean_words([start[i].answer for i in ids]),
                                         "run": mean_words([trained[i].answer for i in ids])}}
    return result


def policy_query(t: Trajectory, runner_searches: int) -> str | None:
    """The first query the policy wrote: the episode's first, or, after `runner_searches` searches the
    runner wrote, the next search's first query (None: the policy never searched)."""
    if runner_searches == 0:
        return first_query(t)
    searched = [turn.queries[0] for turn in t.turns if turn.kind == "search" and turn.queries]
    return searched[runner_searches] if len(searched) > runner_searches else None


def by_first_query(system: dict[str, Trajectory], runner_searches: int = 0) -> dict:
    """Search gain where the policy's first query is the question itself, and where it is a rewrite."""
    groups: dict[str, list[float]] = {"the question": [], "rewritten": []}
    for t in system.values():
        query, gain = policy_query(t, runner_searches), t.metrics.get("search_gain")
        if query is None or gain is None:
            continue
        same = normalize_answer(query) == normalize_answer(t.question)
        groups["the question" if same else "rewritten"].append(gain)
    return {name: {"n": len(gains), "search_gain": ci_record(gains) if gains else None}
            for name, gains in groups.items()}


def run_vs_start(folder: Path, run: str, runner_searches: int = 0) -> dict:
    trained, start = episodes(folder, run), episodes(folder, f"{run} (start)")
    if set(trained) != set(start):
        raise SystemExit(f"{folder}: {run} and {run}_start answered different questions")
    return {"by_start_ending": by_start_ending(start, trained),
            "by_first_query": {"start": by_first_query(start, runner_searches),
                               "run": by_first_query(trained, runner_searches)}}


def tables(result: dict) -> list[str]:
    ending = [[name, str(e["n"]), ci_cell(e["f1"]["start"]), ci_cell(e["f1"]["run"]), diff_cell(e["f1"]["run - start"]),
               f"{e['run answered %']:.1f}", str(e["answer words"]["start"]), str(e["answer words"]["run"])]
              for name, e in result["by_start_ending"].items()]
    first = [[who, name, str(g["n"]), ci_cell(g["search_gain"], signed=True)]
             for who, groups in result["by_first_query"].items() for name, g in groups.items()]
    return [*markdown_table(["the start's episode ended", "n", "F1: start", "run", "run − start", "run answered %",
                             "answer words: start", "run"], ending), "",
            *markdown_table(["system", "the policy's first query" if result.get("runner_searches") else "first query",
                             "n", "search gain"], first)]


def main() -> None:
    args = run_against_start_args(__doc__.split("\n\n")[0], runner_searches=True)
    result = {"compare": str(args.compare), "run": args.run, "runner_searches": args.runner_searches,
              **run_vs_start(args.compare, args.run, args.runner_searches)}
    write_results(args.out, result, tables(result))   # and prints the tables


if __name__ == "__main__":
    main()
