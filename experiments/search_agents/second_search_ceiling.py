"""How much a second search can add, and what the agents' second searches name (issue #53).

The ceiling: each question is searched as it is (top 3), then a second query names the title of a gold
passage the first search missed (top 3); the search gain at equal passages is taken against the
question's own top N, N the distinct passages of both searches. Then, for each agent of an earlier
`ragrl compare` folder, each second query is sorted by what it names: the title of a gold passage the
first search missed (the ceiling's query), a title the first search showed (gold or not: copied from
what it read), the question itself (`rollout.title_fallback: question`, served as the question's next
passages), or neither (written from the question, or made up), with the share of each and its mean
search gain there; and the share of every episode (those without gold ids too) whose second query is
the question. BM25 over the comparison's corpus;
reads only the comparison's questions (a train/ split held apart, never eval/). Seconds on a CPU.

    .venv/bin/python -m experiments.search_agents.second_search_ceiling --compare runs/learn_rbc_compare \\
        --out experiments/search_agents/results/second_search_ceiling.json
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from ragrl.compare.runs import resolve_kit
from ragrl.retrieval.corpus import load_corpus
from ragrl.retrieval.resolve import retriever_for
from ragrl.rewards.qa import answer_in, is_yes_no

CORPUS = "kit:corpus/wiki_passages.jsonl.gz"


def norm(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def gain(shown: list[str], deep_texts: list[str], golds: list[str]) -> float:
    """1 if the shown passages hold an answer, minus 1 if the question's own top len(shown) does."""
    return answer_in(shown, golds) - answer_in(deep_texts[:len(shown)], golds)


def ceiling(questions: list[dict], retriever, title) -> dict:
    first = retriever.search([q["question"] for q in questions], 3)
    deep = retriever.search([q["question"] for q in questions], 30)
    titles = []
    for q, hits in zip(questions, first):
        missed = [g for g in q["gold_passage_ids"] if g not in {h.id for h in hits}]
        titles.append(title(missed[0]) if missed else None)
    out = {"questions": len(questions), "first_search_holds_every_gold": sum(t is None for t in titles)}
    for mode in ("title", "question + title"):
        queries = [(t if mode == "title" else f"{q['question']} {t}") if t else q["question"]
                   for q, t in zip(questions, titles)]
        second = retriever.search(queries, 3)
        gains = []
        for q, a, b, d in zip(questions, first, second, deep):
            shown = {h.id: h.text for h in a + b}
            gains.append(gain(list(shown.values()), [h.text for h in d], q["answers"]))
        out[mode] = {"search_gain": round(100 * sum(gains) / len(gains), 1),
                     "won": sum(g > 0 for g in gains), "lost": sum(g < 0 for g in gains)}
    return out


def second_queries(path: Path, questions: dict, title) -> dict:
    """What each episode's second query names, and the episode's search gain by kind."""
    kinds: dict[str, list[float]] = {"missed gold title": [], "title it was shown": [], "the question": [],
                                     "neither": []}
    no_gold, asked_again, episodes = 0, 0, 0
    for t in map(json.loads, path.read_text().splitlines()):
        queries = [(turn["queries"], turn.get("passage_ids") or []) for turn in t["turns"] if turn.get("queries")]
        if len(queries) < 2 or t["metrics"].get("search_gain") is None:
            continue
        episodes += 1
        asked_again += norm(queries[1][0][0]) == norm(t["question"])
        q = questions.get(t["sample_id"])
        if q is None:   # a question without gold passage ids (MuSiQue-train): no missed title to name
            no_gold += 1
            continue
        second, asked = norm(queries[1][0][0]), norm(q["question"])
        if second.startswith(asked + " "):   # second_query: question_title searched the question, then the title
            second = second[len(asked) + 1:]
        shown_ids = {pid for ids in queries[0][1] for pid in ids}
        missed = {norm(title(pid)) for pid in q["gold_passage_ids"] if pid not in shown_ids}
        shown = {norm(title(pid)) for pid in shown_ids}
        kind = ("the question" if second == asked else "missed gold title" if second in missed
                else "title it was shown" if second in shown else "neither")
        kinds[kind].append(t["metrics"]["search_gain"])
    total = sum(len(v) for v in kinds.values())
    return {"episodes_with_two_searches": total, "left_out_without_gold_ids": no_gold,
            "second_query_is_the_question_all_episodes": round(100 * asked_again / episodes, 1) if episodes else None,
            **{k: {"share": round(100 * len(v) / total, 1) if total else None,
                   "search_gain": round(100 * sum(v) / len(v), 1) if v else None} for k, v in kinds.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", type=Path, required=True, help="a `ragrl compare` folder (its questions and agents)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    corpus = load_corpus(resolve_kit(CORPUS))
    retriever = retriever_for(None, CORPUS)

    def title(pid: str) -> str:
        return corpus.get(pid)["title"]

    rows = [json.loads(line) for line in (args.compare / "questions.jsonl").read_text().splitlines()]
    questions = [q for q in rows if q.get("gold_passage_ids") and not is_yes_no(q["answers"])]
    result = {"compare": str(args.compare), "corpus": CORPUS, "ceiling": ceiling(questions, retriever, title),
              "agents": {}}
    by_id = {q["id"]: q for q in questions}
    for path in sorted(args.compare.glob("trajectories_*.jsonl")):
        found = second_queries(path, by_id, title)
        if found["episodes_with_two_searches"]:
            result["agents"][path.stem.removeprefix("trajectories_")] = found
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
