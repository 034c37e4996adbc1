"""Which systems a comparison runs: the baselines, then each run's start and trained policy."""
from __future__ import annotations

from pathlib import Path

from ragrl.compare.runs import RunRecord, SearchSetting
from ragrl.compare.systems import Context, System, system_key, systems_for
from ragrl.methods import METHODS
from ragrl.train.recipe import load_train_config

SETTING = SearchSetting(Path("c"), "s", "bm25", "i")


def _run(label: str, evaluation: str = "agent") -> RunRecord:
    return RunRecord(Path(label), label, None, None, evaluation, Path(label) / "final_adapter",
                     Path(label) / "sft" / "adapter", SETTING)


def test_each_run_brings_its_start_unless_left_out():
    runs = [_run("a"), _run("b", "pipeline"), _run("h", "retriever")]
    assert [(s.name, s.role, s.kind) for s in systems_for(runs)] == [
        ("direct", "baseline", "direct"), ("naive_rag", "baseline", "naive_rag"),
        ("a (start)", "start", "agent"), ("a", "trained", "agent"), ("b (start)", "start", "pipeline"),
        ("b", "trained", "pipeline"), ("h (start)", "start", "retriever"), ("h", "trained", "retriever")]
    assert [s.name for s in systems_for(runs, skip_start=frozenset({"b"}))][2:] == ["a (start)", "a", "b", "h (start)", "h"]
    assert [s.name for s in systems_for(runs, with_start=False)] == ["direct", "naive_rag", "a", "b", "h"]
    start = systems_for(runs)[2]
    assert start.artifact == Path("a/sft/adapter") and systems_for(runs)[3].artifact == Path("a/final_adapter")


def test_runs_that_differ_only_in_how_they_trained_share_their_starts_key():
    """The key holds the rollout as evaluated: a run that sampled differently in training (temperature,
    n, rollout.end_after_searches, a wall-time bound) evaluates its start exactly as another does, so a
    comparison of both runs it once; a setting evaluation keeps (max_turns) still separates them."""
    ctx = Context(samples=[{"id": "q1", "question": "Who?", "answers": ["x"]}], corpus=None, retriever=None,
                  setting=SETTING, reader="r")

    def start_key(*overrides):
        cfg = load_train_config("search_r1_grpo", list(overrides), "learn")
        run = RunRecord(Path("r"), "r", cfg, METHODS["search_r1"], "agent", Path("r/final_adapter"), None, SETTING)
        return system_key(System("r (start)", "start", run, None), ctx)

    base = start_key()
    assert start_key("rollout.temperature=0.7", "rollout.n=4", "rollout.end_after_searches=2",
                     "rollout.max_episode_s=30", "rollout.seed=9", "lr=5e-4") == base
    assert start_key("rollout.max_turns=3") != base
    assert base["rollout"]["temperature"] == 0.0 and base["rollout"]["n"] == 1


def _learn_key(role, *overrides):
    """The comparison key of a `search_r1_grpo --variant learn` run's system in `role`, under `overrides`."""
    ctx = Context(samples=[{"id": "q1", "question": "Who?", "answers": ["x"]}], corpus=None, retriever=None,
                  setting=SETTING, reader="r")
    cfg = load_train_config("search_r1_grpo", list(overrides), "learn")
    run = RunRecord(Path("r"), "r", cfg, METHODS["search_r1"], "agent", Path("r/final_adapter"), None, SETTING)
    return system_key(System("r", role, run, None), ctx)


def test_answer_by_start_changes_a_trained_runs_key_but_not_its_starts():
    """A start writing its own answers is what `rollout.answer_by: start` asks of it: its key (and cached
    episodes) are the plain run's; the trained policy's are not."""
    key = _learn_key
    assert key("start", "rollout.answer_by=start") == key("start", "rollout.answer_by=policy")
    assert key("trained", "rollout.answer_by=start") != key("trained", "rollout.answer_by=policy")
    assert key("trained", "rollout.answer_by=start")["rollout"]["answer_by"] == "start"


def test_answer_by_base_changes_the_starts_key_too_since_the_base_writes_both_answers():
    """Under `rollout.answer_by: base` the base model reads for the trained run and its start alike: the
    start's key is not the plain start's (its cached answers were its own), and both say `base`."""
    key = _learn_key
    assert key("start", "rollout.answer_by=base") != key("start", "rollout.answer_by=policy")
    assert key("start", "rollout.answer_by=base")["rollout"]["answer_by"] == "base"
    assert key("trained", "rollout.answer_by=base")["rollout"]["answer_by"] == "base"
    assert key("trained", "rollout.answer_by=base") != key("trained", "rollout.answer_by=start")
    # the reader (the base over the episode's passages, naive RAG's prompt) is another writer again
    assert key("start", "rollout.answer_by=reader") not in (key("start", "rollout.answer_by=base"),
                                                           key("start", "rollout.answer_by=policy"))
    assert key("trained", "rollout.answer_by=reader")["rollout"]["answer_by"] == "reader"


def test_kept_batches_give_back_only_whole_batches_of_their_own_key_and_sum_their_seconds(tmp_path, caplog):
    from ragrl.compare.systems import KeptBatches
    from ragrl.rollout.trajectory import Trajectory

    def traj(i: int) -> Trajectory:
        return Trajectory(sample_id=str(i), question=f"q{i}?", golds=["a"], token_ids=[1, 2], action_mask=[0, 1],
                          logprobs=[0.0, -0.5], prompt_len=1, answer="a", metrics={"f1": 0.25})

    kept = KeptBatches(tmp_path / "d.partial", {"k": 1}, "sys")
    assert kept.get(0, 2) is None                       # nothing kept yet
    kept.put(0, 2, [traj(0), traj(1)], 3.5)
    kept.put(2, 4, [traj(2), traj(3)], 1.5)
    again = KeptBatches(tmp_path / "d.partial", {"k": 1}, "sys")
    assert [t.to_dict() for t in again.get(0, 2)] == [traj(0).to_dict(), traj(1).to_dict()]
    assert again.get(0, 3) is None                      # another slice of the questions
    assert again.get(2, 4)[1].sample_id == "3"
    assert again.earlier_s == 5.0
    assert KeptBatches(tmp_path / "d.partial", {"k": 2}, "sys").get(0, 2) is None   # another system's key
    (tmp_path / "d.partial" / "000002-000004.json").write_text("{cut")
    with caplog.at_level("WARNING", logger="ragrl"):
        assert again.get(2, 4) is None
    assert "kept batch" in caplog.text and "its record is not JSON" in caplog.text
