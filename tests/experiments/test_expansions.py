"""experiments/search_agents/expansions.py: what a query-expanding searcher adds to the question."""
from __future__ import annotations

from experiments.search_agents.expansions import run_and_start, tables
from ragrl.eval.report import write_trajectories
from ragrl.rollout.trajectory import Trajectory, Turn


def write(folder, name, rows):
    """rows: id -> (first query or None, search gain, golds), as a comparison writes them."""
    write_trajectories(folder / f"trajectories_{name}.jsonl", [
        Trajectory(sample_id=i, question=f"Who founded {i} Records?", golds=golds, token_ids=[], action_mask=[],
                   logprobs=[], prompt_len=0, metrics={"search_gain": g},
                   turns=[] if q is None else [Turn("", "search", queries=[q]), Turn("", "answer")])
        for i, (q, g, golds) in rows.items()])


def test_each_first_query_is_grouped_by_what_it_adds_to_the_question(tmp_path):
    write(tmp_path, "r_start", {
        "k": ("Who founded k Records? Who founded k Records?", 0.0, ["Ann Lee"]),   # the question again
        "m": ("Who founded m Records? founded", 1.0, ["Bo"]),                       # a word already in it
        "p": ("Who founded p Records? label owner", -1.0, ["Cy"]),                  # new words
        "s": (None, None, ["Di"])})                                                 # no search: left out
    write(tmp_path, "r", {
        "k": ("Who founded k Records? Ann Lee's label", 1.0, ["Ann Lee"]),          # names an answer
        "m": ("Who founded m Records? Bob", 0.0, ["Bo"]),                           # "Bo" is not a whole word of it
        "p": ("label owner", None, ["Cy"]),                                         # no prefix: all of it is added
        "s": ("Who founded s Records?", 0.0, ["Di"])})
    result = run_and_start(tmp_path, "r")
    start, run = result["start"]["groups"], result["run"]["groups"]
    assert [start[g]["n"] for g in start] == [2, 0, 1] and result["start"]["queries"] == 3
    assert start["adds no new word"]["search_gain"]["mean"] == 50.0
    assert start["adds other words"]["search_gain"]["mean"] == -100.0
    assert result["start"]["new words a query"] == round(2 / 3, 2)
    assert [run[g]["n"] for g in run] == [1, 1, 2]
    # p has no search gain: counted in its group, left out of the gain
    assert run["adds other words"]["with a search gain"] == 1 and run["names an answer"]["search_gain"]["mean"] == 100.0
    assert result["run"]["new words a query"] == (3 + 1 + 2 + 0) / 4   # "ann lee label", "bob", "label owner"
    assert "| run | names an answer | 1 | +100.0" in "\n".join(tables(result))


def test_a_search_the_runner_wrote_is_passed_over_for_the_policys_query(tmp_path):
    """s3's shape (rollout.first_action: question): the runner searches the question first; what the policy
    added is read from its own search after it, not from the runner's (which adds nothing)."""
    q = "Who founded k Records?"
    write_trajectories(tmp_path / "trajectories_r.jsonl", [Trajectory(
        sample_id="k", question=q, golds=["Ann Lee"], token_ids=[], action_mask=[], logprobs=[], prompt_len=0,
        metrics={"search_gain": 1.0},
        turns=[Turn("", "search", queries=[q], by_runner=True), Turn("", "search", queries=[f"{q} Ann Lee"])])])
    write_trajectories(tmp_path / "trajectories_r_start.jsonl", [])
    run = run_and_start(tmp_path, "r")["run"]
    assert run["groups"]["names an answer"]["n"] == 1 and run["groups"]["adds no new word"]["n"] == 0
    assert run["new words a query"] == 2.0
