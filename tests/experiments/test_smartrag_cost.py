"""The SmartRAG cost ablation's figures, by hand: the fifth-cost rule, selectivity's terms and the
verdict, then the whole table from a small comparison folder written here."""
import json

import pytest

from experiments.ablations.smartrag_cost import (ablation, arm_name, fifth_cost, selectivity_diff, selectivity_record,
                                                 stratified_draws, verdict)
from ragrl.eval.report import write_trajectories
from ragrl.rollout.trajectory import Trajectory


def test_fifth_cost_bisects_only_when_no_arm_is_in_the_band():
    assert fifth_cost({0.0: 0.9, 0.02: 0.85, 0.05: 0.1, 0.1: 0.0}) == 0.035
    assert fifth_cost({0.0: 0.9, 0.02: 0.7, 0.1: 0.0}) is None        # 0.02 is in [0.2, 0.8]
    assert fifth_cost({0.0: 0.95, 0.1: 0.9}) is None                  # nothing brackets 0.5
    assert fifth_cost({0.1: 0.0, 0.0: 0.9}) == 0.05                   # order of the dict does not matter


def test_selectivity_is_the_rate_difference_with_groups_resampled_within_themselves():
    pays = [True, True, True, False, False, False]
    draws = stratified_draws(pays, n_boot=500)
    assert draws[0].shape == (500, 3) and draws[1].shape == (500, 3)
    rec = selectivity_record([1, 1, 0, 1, 0, 0], pays, draws)
    assert rec["mean"] == pytest.approx(100 * (2 / 3 - 1 / 3)) and rec["ci_lo"] <= rec["mean"] <= rec["ci_hi"]
    # retrieving everywhere is not selective at all, and no draw can say otherwise: the groups keep their sizes
    flat = selectivity_record([1] * 6, pays, draws)
    assert (flat["mean"], flat["ci_lo"], flat["ci_hi"]) == (0.0, 0.0, 0.0)
    same = selectivity_diff([1, 0, 1, 0, 1, 0], [1, 0, 1, 0, 1, 0], pays, draws)
    assert (same["diff"], same["ci_lo"], same["ci_hi"]) == (0.0, 0.0, 0.0)
    better = selectivity_diff([1] * 6, [1, 1, 1, 0, 0, 0], pays, draws)   # from 0 to 100 points
    assert better["diff"] == 100.0 and better["ci_lo"] == 100.0 and better["p_value"] < 0.01
    with pytest.raises(ValueError, match="both sides"):
        stratified_draws([True, True])


def _d(lo, hi):
    return {"diff": (lo + hi) / 2, "ci_lo": lo, "ci_hi": hi}


def test_verdict_follows_the_rule():
    keeps_f1 = {"retrieval_rate": _d(-60, -40), "f1": _d(-1.9, 2.0), "selectivity": _d(1, 8)}
    assert verdict({"cost_0.1": keeps_f1}) == "reproduced in direction"
    # F1 may not fall by more than 2 points: a CI reaching -2.1 is not "equal accuracy"
    assert verdict({"cost_0.1": {**keeps_f1, "f1": _d(-2.1, 1.0)}}) == "no clear difference"
    # no arm retrieves less: nothing to judge, whatever else moved
    assert verdict({"cost_0.1": {**keeps_f1, "retrieval_rate": _d(-5, 3)}}) == "no clear difference"
    assert verdict({"cost_0.1": {**keeps_f1, "selectivity": _d(-9, -1)}}) == "not reproduced"


def _episode(qid, f1, searches, answer_shown=0.0):
    return Trajectory(qid, "q", ["a"], [], [], [], 0, num_searches=searches,
                      metrics={"em": f1, "f1": f1, "cover_em": f1, "searches": searches, "answer_shown": answer_shown})


def test_ablation_reads_a_comparison_folder(tmp_path):
    ids = [f"q{i}" for i in range(8)]
    (tmp_path / "questions.jsonl").write_text(
        "".join(json.dumps({"id": i, "dataset": "popqa" if n < 4 else "hotpotqa"}) + "\n" for n, i in enumerate(ids)))
    pays = [True, True, False, False, True, False, True, False]   # direct wrong and naive RAG shows an answer
    write_trajectories(tmp_path / "trajectories_direct.jsonl", [_episode(i, 0.0 if p else 1.0, 0) for i, p in zip(ids, pays)])
    write_trajectories(tmp_path / "trajectories_naive_rag.jsonl", [_episode(i, 0.5, 1, 1.0) for i in ids])
    write_trajectories(tmp_path / "trajectories_cost_0_start.jsonl", [_episode(i, 0.5, 1) for i in ids])
    write_trajectories(tmp_path / "trajectories_cost_0.jsonl", [_episode(i, 0.5, 1) for i in ids])
    # cost 0.1 searches exactly where retrieval pays, and keeps F1
    write_trajectories(tmp_path / "trajectories_cost_0.1.jsonl", [_episode(i, 0.5, int(p)) for i, p in zip(ids, pays)])
    out = ablation(tmp_path, [0.0, 0.1])
    pooled = out["sets"]["pooled"]
    assert pooled["n"] == 8 and pooled["paying_questions"] == 4
    assert pooled["systems"][arm_name(0.1)]["retrieval_rate"]["mean"] == 50.0
    assert pooled["systems"][arm_name(0.1)]["selectivity"]["mean"] == 100.0     # 100% on paying, 0% on the rest
    assert pooled["systems"][arm_name(0.0)]["selectivity"]["mean"] == 0.0
    assert pooled["systems"]["naive RAG"]["retrieval_rate"]["mean"] == 100.0
    assert pooled["systems"]["direct"]["f1"]["mean"] == 50.0                    # right on the 4 that do not pay
    vs0 = pooled["vs_cost_0"][arm_name(0.1)]
    assert vs0["retrieval_rate"]["diff"] == -50.0 and vs0["f1"]["diff"] == 0.0
    assert out["sets"]["popqa"]["n"] == 4 and out["sets"]["hotpotqa"]["paying_questions"] == 2
    assert out["verdict"] == "reproduced in direction"
