"""experiments/search_agents/per_set.py: a comparison folder's run against its start, per set and pooled."""
from __future__ import annotations

import json

from experiments.search_agents.per_set import per_set, table
from ragrl.eval.report import write_trajectories
from ragrl.rollout.trajectory import Trajectory


def test_each_set_and_the_pool_pair_the_run_with_its_start_on_the_same_questions(tmp_path):
    qs = [{"id": "h1", "dataset": "hotpotqa"}, {"id": "h2", "dataset": "hotpotqa"},
          {"id": "m1", "dataset": "musique"}, {"id": "m2", "dataset": "musique"}]
    (tmp_path / "questions.jsonl").write_text("\n".join(json.dumps(q) for q in qs))
    start = {"h1": (0.0, 0.0, 0.0), "h2": (0.5, 1.0, 1.0), "m1": (0.0, 0.0, None), "m2": (1.0, 1.0, 0.0)}
    run = {"h1": (1.0, 1.0, 1.0), "h2": (0.5, 1.0, 1.0), "m1": (0.0, 1.0, None), "m2": (0.0, 0.0, -1.0)}
    for name, rows in (("r_start", start), ("r", run)):
        write_trajectories(tmp_path / f"trajectories_{name}.jsonl", [
            Trajectory(sample_id=i, question="q", golds=[], token_ids=[], action_mask=[], logprobs=[], prompt_len=0,
                       metrics={"f1": f, "answer_shown": a, "search_gain": g}) for i, (f, a, g) in rows.items()])
    result = per_set(tmp_path, "r")
    assert set(result) == {"hotpotqa", "musique", "pooled"} and result["pooled"]["n"] == 4
    hot, mus, pool = result["hotpotqa"], result["musique"], result["pooled"]
    assert hot["f1"]["run - start"]["diff"] == 50.0 and hot["search_gain"]["run"]["mean"] == 100.0
    # a yes/no question (no search gain) is left out of the gain alone
    assert mus["search_gain"]["run - start"]["n"] == 1 and mus["search_gain"]["run - start"]["diff"] == -100.0
    assert mus["answer_shown"]["run - start"]["n"] == 2 and mus["answer_shown"]["run - start"]["diff"] == 0.0
    assert pool["f1"]["run - start"]["diff"] == (1.0 + 0.0 + 0.0 - 1.0) / 4 * 100
    lines = table([{"run": "r", "sets": result}])
    assert lines[0].startswith("| run | set | n | F1: start |") and len(lines) == 2 + 3
    # the search gain's cells are signed, the others not; the paired cell is the record's difference
    hot_row = lines[2].split("|")
    assert hot_row[1:3] == [" r ", " hotpotqa "] and hot_row[11].strip().startswith("+100.0")
    assert hot_row[4].strip().startswith("25.0") and hot_row[10].strip().startswith("+50.0")
