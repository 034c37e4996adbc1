"""experiments/leaderboard/run_vs_start.py: where a run moved against its start, split two ways."""
from __future__ import annotations

import pytest

from experiments.leaderboard.run_vs_start import run_vs_start, tables
from ragrl.eval.report import write_trajectories
from ragrl.rollout.trajectory import Trajectory, Turn


def write(folder, name, rows):
    """rows: id -> (f1, search gain, stop reason, answer, first query or None), as a comparison writes them."""
    write_trajectories(folder / f"trajectories_{name}.jsonl", [
        Trajectory(sample_id=i, question=f"Where is {i}?", golds=[], token_ids=[], action_mask=[], logprobs=[],
                   prompt_len=0, stop_reason=stop, answer=answer, metrics={"f1": f, "search_gain": g},
                   turns=[] if q is None else [Turn("", "search", queries=[q]), Turn("", "answer")])
        for i, (f, g, stop, answer, q) in rows.items()])


def test_the_f1_is_split_by_the_starts_ending_and_the_gain_by_the_first_query(tmp_path):
    write(tmp_path, "r_start", {"a": (0.5, 0.0, "answer", "two words", "where is a"),
                                "b": (1.0, -1.0, "answer", "one", "b city"),
                                "c": (0.0, None, "max_turns", None, None)})
    write(tmp_path, "r", {"a": (0.5, 1.0, "answer", "x", "Where is a?"), "b": (0.0, 0.0, "answer", "y z w", "b"),
                          "c": (1.0, None, "answer", "Paris", "Where is c")})
    result = run_vs_start(tmp_path, "r")
    ending = result["by_start_ending"]
    assert list(ending) == ["answer", "max_turns", "all"]
    assert ending["answer"]["n"] == 2 and ending["answer"]["f1"]["run - start"]["diff"] == -50.0
    assert ending["max_turns"]["f1"]["run - start"]["diff"] == 100.0 and ending["max_turns"]["run answered %"] == 100.0
    # words are counted over the answers given; the start's unanswered episode has none
    assert ending["answer"]["answer words"] == {"start": 1.5, "run": 2.0}
    assert ending["max_turns"]["answer words"] == {"start": None, "run": 1.0}
    assert ending["all"]["f1"]["run - start"]["diff"] == pytest.approx(100 * (0 - 1.0 + 1.0) / 3)
    # the question word for word after normalisation ("Where is a?" = "where is a"); c has no search gain
    first = result["by_first_query"]
    assert first["start"]["the question"]["n"] == 1 and first["start"]["rewritten"]["search_gain"]["mean"] == -100.0
    assert first["run"]["the question"]["search_gain"]["mean"] == 100.0 and first["run"]["rewritten"]["n"] == 1
    lines = tables(result)
    assert lines[3].startswith("| max_turns | 1 |") and "| run | rewritten | 1 |" in "\n".join(lines)


def test_a_run_and_start_over_different_questions_are_refused(tmp_path):
    write(tmp_path, "r_start", {"a": (0.5, 0.0, "answer", "x", "q")})
    write(tmp_path, "r", {"b": (0.5, 0.0, "answer", "x", "q")})
    with pytest.raises(SystemExit, match="different questions"):
        run_vs_start(tmp_path, "r")


def test_a_pipelines_generator_episodes_count_as_answered_and_their_first_query_is_the_rewriters(tmp_path):
    """MMOA-RAG's comparison keeps the generator's episode: no search turn, its stop reason eos or
    length, the rewriter's sub-questions in its metrics."""
    def generator(i, f, g, stop, answer, subquestions):
        return Trajectory(sample_id=i, question=f"Where is {i}?", golds=[], token_ids=[], action_mask=[], logprobs=[],
                          prompt_len=0, stop_reason=stop, answer=answer, agent="generator",
                          metrics={"f1": f, "search_gain": g, "subquestions": subquestions})
    for name, rows in (("m_start", [generator("a", 0.0, -1.0, "eos", "Rome", ["a's city"]),
                                    generator("b", 0.0, 0.0, "length", "", ["Where is b?"])]),
                       ("m", [generator("a", 1.0, 0.0, "eos", "Paris", ["Where is a?", "a's city"]),
                              generator("b", 0.5, 1.0, "length", "Paris, which", ["b's country"])])):
        write_trajectories(tmp_path / f"trajectories_{name}.jsonl", rows)
    result = run_vs_start(tmp_path, "m")
    assert result["by_start_ending"]["all"]["run answered %"] == 100.0
    assert result["by_start_ending"]["length"]["answer words"] == {"start": None, "run": 2.0}
    first = result["by_first_query"]
    assert first["start"]["the question"]["n"] == 1 and first["start"]["rewritten"]["search_gain"]["mean"] == -100.0
    assert first["run"]["the question"]["search_gain"]["mean"] == 0.0 and first["run"]["rewritten"]["n"] == 1


def test_after_the_runners_search_the_split_reads_the_policys_first_query(tmp_path):
    """`--runner-searches 1` (rollout.first_action: question): the runner's search of the question is
    skipped; an episode whose policy never searched (its query left unclosed) is left out."""
    def episode(i, gain, *queries):
        return Trajectory(sample_id=i, question=f"Where is {i}?", golds=[], token_ids=[], action_mask=[], logprobs=[],
                          prompt_len=0, stop_reason="answer", answer="x", metrics={"f1": 0.0, "search_gain": gain},
                          turns=[*(Turn("", "search", queries=[q]) for q in queries), Turn("", "answer")])
    for name in ("h_start", "h"):
        write_trajectories(tmp_path / f"trajectories_{name}.jsonl", [
            episode("a", 0.0, "Where is a?", "where is a"), episode("b", -1.0, "Where is b?", "b's town"),
            episode("c", 0.0, "Where is c?")])
    first = run_vs_start(tmp_path, "h", runner_searches=1)["by_first_query"]["run"]
    assert first["the question"]["n"] == 1 and first["rewritten"]["n"] == 1
    assert first["rewritten"]["search_gain"]["mean"] == -100.0
    # read from the first search instead, every episode's first query is the question
    assert run_vs_start(tmp_path, "h")["by_first_query"]["run"]["the question"]["n"] == 3
    lines = tables({**run_vs_start(tmp_path, "h", runner_searches=1), "runner_searches": 1})
    assert "| system | the policy's first query | n | search gain |" in lines
