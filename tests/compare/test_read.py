"""Reading a comparison folder back, and the training loop an ablation shares with `compare --train`:
named arms of one recipe, every arm resolved before any trains, a finished run not trained again."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragrl.compare.read import episodes, question_sets
from ragrl.compare.train_runs import plan_arms, train_runs
from ragrl.errors import ConfigError, RagrlError
from ragrl.eval.report import write_trajectories
from ragrl.rollout.trajectory import Trajectory


def _questions(folder: Path, datasets: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "questions.jsonl").write_text("".join(json.dumps({"id": f"q{n}", "dataset": d}) + "\n"
                                                    for n, d in enumerate(datasets)))


def test_question_sets_group_by_dataset_then_pool(tmp_path):
    _questions(tmp_path, ["musique", "hotpotqa", "musique"])
    assert question_sets(tmp_path) == {"musique": ["q0", "q2"], "hotpotqa": ["q1"], "pooled": ["q0", "q1", "q2"]}


def test_a_set_named_pooled_and_a_folder_without_questions_are_refused(tmp_path):
    _questions(tmp_path / "clash", ["pooled", "hotpotqa"])
    with pytest.raises(RagrlError, match="'pooled'"):
        question_sets(tmp_path / "clash")
    with pytest.raises(RagrlError, match="questions.jsonl is missing"):
        question_sets(tmp_path / "empty")


def test_episodes_find_a_runs_start_by_the_name_compare_gives_it(tmp_path):
    write_trajectories(tmp_path / "trajectories_learn_x_start.jsonl",
                       [Trajectory("q0", "q", ["a"], [], [], [], 0, metrics={"f1": 0.5})])
    assert episodes(tmp_path, "learn_x (start)")["q0"].metrics == {"f1": 0.5}
    with pytest.raises(RagrlError, match="no episodes of the system 'learn_y'"):
        episodes(tmp_path, "learn_y")


def test_plan_arms_resolves_each_arm_with_its_own_overrides(tmp_path):
    plans = plan_arms({"low": ("smartrag_ppo", ["reward.smartrag.cost=0.0"]),
                       "high": ("smartrag_ppo", ["reward.smartrag.cost=0.1", "steps=7"])}, tmp_path, variant="tiny")
    assert [name for name, _ in plans] == ["low", "high"]
    low, high = dict(plans)["low"], dict(plans)["high"]
    assert Path(low.out_dir) == tmp_path / "low" and Path(high.out_dir) == tmp_path / "high"
    assert low.reward["smartrag"]["cost"] == 0.0 and high.reward["smartrag"]["cost"] == 0.1
    assert high.steps == 7 and low.steps != 7


def test_a_typo_in_a_later_arm_is_refused_before_any_arm_trains(tmp_path):
    with pytest.raises(ConfigError, match="rollout.frist_action"):
        plan_arms({"ok": ("smartrag_ppo", []), "typo": ("smartrag_ppo", ["rollout.frist_action=free"])},
                  tmp_path, variant="tiny")
    assert not (tmp_path / "ok").exists()


def test_a_finished_run_is_not_trained_again(tmp_path):
    plans = plan_arms({"done": ("smartrag_ppo", [])}, tmp_path, variant="tiny")
    (tmp_path / "done" / "final_adapter").mkdir(parents=True)
    assert train_runs(plans) == [tmp_path / "done"]
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == ["final_adapter"]   # no log, no checkpoint
