"""What a query-expanding searcher adds to the question, and what each kind of addition finds (issue #53,
candidate AF: `rollout.query_prefix: question`, where the runner searches the question followed by what the
policy wrote).

For the run and its start in one `ragrl compare` folder, each episode's first search that the policy
wrote (a search the runner wrote, `rollout.first_action: question`, is passed over) is split into the
question and what was added to it (a query that does not start with the question counts whole as added),
and put in one of three groups:
- **adds no new word**: every word added (after `ragrl.text.normalize_answer`) is already in the question,
  the question written again included;
- **names an answer**: the added text holds a gold answer (normalised, whole words, a possessive's 's
  dropped);
- **adds other words**: the rest.

Each group's count and search gain (95% bootstrap CI; questions without a search gain, yes/no ones, left
out), and each system's mean count of new words a query. Deciding nothing: read beside the rule's verdict.

    .venv/bin/python -m experiments.search_agents.expansions --compare runs/learn_af_judge --run learn_af \\
        --out experiments/search_agents/results/learn_af_judge_expansions
"""
from __future__ import annotations

import re
from pathlib import Path

from ragrl.compare.read import episodes
from ragrl.eval.cells import ci_cell, markdown_table, write_results
from ragrl.eval.stats import ci_record
from ragrl.rollout.trajectory import Trajectory
from ragrl.text import normalize_answer

from experiments.search_agents.per_set import run_against_start_args

GROUPS = ("adds no new word", "names an answer", "adds other words")


def added_text(t: Trajectory, query: str) -> str:
    """What the query adds to the question: the text after it where the query starts with it, else all.

    >>> added_text(Trajectory(sample_id="a", question="Who is X?", golds=[], token_ids=[], action_mask=[],
    ...                       logprobs=[], prompt_len=0), "Who is X? X's wife")
    "X's wife"
    """
    return query[len(t.question) + 1:] if query.startswith(f"{t.question} ") else query


def policy_first_query(t: Trajectory) -> str | None:
    """The first query the policy's own searches sent (None: it wrote none). Episodes recorded before
    turns were marked as the runner's read as the policy's, which they were (AF's shape).

    >>> from ragrl.rollout.trajectory import Turn
    >>> t = Trajectory(sample_id="a", question="Who is X?", golds=[], token_ids=[], action_mask=[],
    ...                logprobs=[], prompt_len=0, turns=[Turn("", "search", queries=["Who is X?"], by_runner=True),
    ...                                                  Turn("", "search", queries=["Who is X? Y"])])
    >>> policy_first_query(t)
    'Who is X? Y'
    """
    return next(iter(t.policy_queries), None)


def new_words(t: Trajectory, added: str) -> set[str]:
    """The words (normalised) that the added text holds and the question does not."""
    return set(normalize_answer(added).split()) - set(normalize_answer(t.question).split())


def names_an_answer(t: Trajectory, added: str) -> bool:
    plain = normalize_answer(re.sub(r"'s\b", "", added))   # "Ann Lee's label" names "Ann Lee"
    return any(g and f" {g} " in f" {plain} " for g in map(normalize_answer, t.golds))


def expansions(system: dict[str, Trajectory]) -> dict:
    gains: dict[str, list[float]] = {g: [] for g in GROUPS}
    counts = dict.fromkeys(GROUPS, 0)
    new_counts = []
    for t in system.values():
        query = policy_first_query(t)
        if query is None:
            continue
        added = added_text(t, query)
        new = new_words(t, added)
        group = GROUPS[0] if not new else GROUPS[1] if names_an_answer(t, added) else GROUPS[2]
        counts[group] += 1
        new_counts.append(len(new))
        if t.metrics.get("search_gain") is not None:
            gains[group].append(t.metrics["search_gain"])
    return {"queries": len(new_counts),
            "new words a query": round(sum(new_counts) / len(new_counts), 2) if new_counts else None,
            "groups": {g: {"n": counts[g], "with a search gain": len(gains[g]),
                           "search_gain": ci_record(gains[g]) if gains[g] else None} for g in GROUPS}}


def run_and_start(folder: Path, run: str) -> dict:
    return {"start": expansions(episodes(folder, f"{run} (start)")), "run": expansions(episodes(folder, run))}


def tables(result: dict) -> list[str]:
    rows = [[who, name, str(g["n"]), ci_cell(g["search_gain"], signed=True)]
            for who in ("start", "run") for name, g in result[who]["groups"].items()]
    words = [[who, str(result[who]["queries"]), str(result[who]["new words a query"])] for who in ("start", "run")]
    return [*markdown_table(["system", "first query", "n", "search gain"], rows), "",
            *markdown_table(["system", "first queries", "new words a query"], words)]


def main() -> None:
    args = run_against_start_args(__doc__.split("\n\n")[0])
    result = {"compare": str(args.compare), "run": args.run, **run_and_start(args.compare, args.run)}
    write_results(args.out, result, tables(result))


if __name__ == "__main__":
    main()
