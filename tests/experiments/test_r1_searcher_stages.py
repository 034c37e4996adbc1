"""R1-Searcher's stage ablation: the arms differ only in what their first 20 steps reward, and the table
and verdict, by hand, from a small comparison folder written here."""
import json
from pathlib import Path

from experiments.ablations.common import either_axis_verdict as verdict
from experiments.ablations.common import held_apart
from experiments.ablations.r1_searcher_stages import ALONE, CLAIM, STAGE1, TWO, ablation, arms
from ragrl.compare.train_runs import plan_arms
from ragrl.eval.report import write_trajectories
from ragrl.rollout.trajectory import Trajectory


def test_the_arms_are_equal_in_steps_and_differ_only_in_the_first_stage(tmp_path):
    plans = dict(plan_arms(arms(tmp_path), tmp_path, variant="learn"))
    stage1, two, alone = plans[STAGE1], plans[TWO], plans[ALONE]
    assert stage1.steps + two.steps == alone.steps == 40
    assert stage1.reward == {"r1_searcher_stage1": 1.0}            # the paper's rewards, no search_gain
    assert two.reward == alone.reward == {"r1_searcher_stage2": 1.0}
    assert Path(two.model.init_adapter) == tmp_path / STAGE1 / "final_adapter"
    assert stage1.model.init_adapter == alone.model.init_adapter == str(tmp_path / "sft" / "adapter")
    for cfg in plans.values():
        assert cfg.rollout.first_action == "free" and cfg.seed == 0 and cfg.sft.steps == 0
        assert Path(cfg.out_dir).parent == tmp_path
    # apart from the reward, the start, the steps and where it writes, stage 2 alone is the two-stage arm's stage 2
    differs = {k for k in vars(two) if getattr(two, k) != getattr(alone, k)}
    assert differs == {"steps", "model", "out_dir"}
    assert {k for k in vars(two.model) if getattr(two.model, k) != getattr(alone.model, k)} == {"init_adapter"}


def _d(lo, hi):
    return {"diff": (lo + hi) / 2, "ci_lo": lo, "ci_hi": hi}


def test_verdict_needs_one_axis_above_and_none_below():
    assert verdict({"f1": _d(0.1, 2), "search_gain": _d(-3, 3)}) == "reproduced in direction"
    assert verdict({"f1": _d(-3, 3), "search_gain": _d(0.1, 9)}) == "reproduced in direction"
    assert verdict({"f1": _d(-2, -0.1), "search_gain": _d(-3, 3)}) == "not reproduced"
    assert verdict({"f1": _d(0.1, 2), "search_gain": _d(-9, -0.1)}) == "no clear difference"   # split
    assert verdict({"f1": _d(-0.1, 2), "search_gain": _d(-3, 3)}) == "no clear difference"
    assert verdict({"f1": _d(-2, -0.1), "search_gain": None}) == "not reproduced"   # no question had a gain


def _episode(qid, f1, searches, gain, format_errors=0):
    return Trajectory(qid, "q", ["a"], [], [], [], 0, num_searches=searches, format_errors=format_errors,
                      metrics={"em": f1, "f1": f1, "cover_em": f1, "searches": searches, "search_gain": gain})


def test_ablation_reads_a_comparison_folder(tmp_path):
    ids = [f"q{i}" for i in range(6)]
    (tmp_path / "questions.jsonl").write_text(
        "".join(json.dumps({"id": i, "dataset": "hotpotqa" if n < 4 else "musique"}) + "\n" for n, i in enumerate(ids)))
    for name in ("direct", "naive_rag"):
        write_trajectories(tmp_path / f"trajectories_{name}.jsonl", [_episode(i, 0.0, 0, None) for i in ids])
    write_trajectories(tmp_path / "trajectories_two_stages_start.jsonl", [_episode(i, 0.0, 1, 0.0, 1) for i in ids])
    # two stages: right on every question, a gain of +1 on four of them (q5 is yes/no: no gain at all)
    write_trajectories(tmp_path / "trajectories_two_stages.jsonl",
                       [_episode(i, 1.0, 2, None if i == "q5" else (1.0 if n < 4 else 0.0)) for n, i in enumerate(ids)])
    write_trajectories(tmp_path / "trajectories_stage2_alone.jsonl", [_episode(i, 0.5, 1, 0.0) for i in ids])
    out = ablation(tmp_path)
    pooled = out["sets"]["pooled"]
    assert pooled["n"] == 6 and out["sets"]["hotpotqa"]["n"] == 4 and out["sets"]["musique"]["n"] == 2
    start = pooled["systems"]["SFT start"]
    assert start["f1"]["mean"] == 0.0 and start["format_errors"]["mean"] == 100.0 and start["searches"]["mean"] == 1.0
    assert pooled["systems"]["direct"]["search_gain"] is None                     # no episode has a gain
    two = pooled["systems"][TWO]
    assert two["search_gain"]["n"] == 5 and two["search_gain"]["mean"] == 80.0    # q5 has none
    claim = pooled["paired"][CLAIM]
    assert claim["f1"]["diff"] == 50.0 and claim["f1"]["n"] == 6
    assert claim["search_gain"]["n"] == 5 and claim["search_gain"]["diff"] == 80.0
    assert claim["searches"]["diff"] == 1.0 and claim["format_errors"]["diff"] == 0.0
    assert pooled["paired"][f"{ALONE} − SFT start"]["f1"]["diff"] == 50.0
    assert pooled["paired"][f"{ALONE} − SFT start"]["format_errors"]["diff"] == -100.0
    assert out["sets"]["musique"]["paired"][CLAIM]["search_gain"]["n"] == 1
    assert out["verdict"] == "reproduced in direction"


def test_held_apart_reads_each_evaluation_at_its_one_based_step(tmp_path):
    rows = [{"step": 0, "loss": 1.0},
            {"step": 19, "eval/f1": 7.0, "eval/search_gain": -3.0, "eval/searches": 1.5, "eval/format_error_rate": 0.1}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert held_apart(tmp_path) == {20: {"f1": 7.0, "search_gain": -3.0, "searches": 1.5, "format_error_rate": 0.1}}
