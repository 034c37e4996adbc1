"""`ragrl quickstart` end to end on the tiny model (all six stages, tiny budgets), run twice:
the second run starts fresh and keeps the first run's directory under another name."""
import pytest

from ragrl.errors import ConfigError
from ragrl.quickstart.agent_job import fresh_run_config, keep_previous_run, run_quickstart


def test_keep_previous_run_moves_an_earlier_run_aside(tmp_path):
    out = tmp_path / "qs"
    assert keep_previous_run(out) is None          # nothing there yet
    out.mkdir()
    assert keep_previous_run(out) is None          # an empty dir is reused
    (out / "before_after.md").write_text("first")
    moved = keep_previous_run(out)
    assert not out.exists() and (moved / "before_after.md").read_text() == "first"
    out.mkdir()
    (out / "x").write_text("second")
    moved2 = keep_previous_run(out)
    assert moved2 != moved and (moved2 / "x").read_text() == "second"


@pytest.mark.parametrize("recipe", ["search_r1_grpo", "harr_grpo"])   # the agent job's and the retriever job's
def test_a_bad_override_is_refused_before_the_earlier_run_is_moved_or_anything_loads(recipe, tmp_path):
    out = tmp_path / "qs"
    out.mkdir()
    (out / "before_after.md").write_text("earlier run")
    with pytest.raises(ConfigError, match="save_every must be >= 1, got 0"):
        fresh_run_config(recipe, out, ["save_every=0"], steps=100)
    assert (out / "before_after.md").read_text() == "earlier run" and len(list(tmp_path.iterdir())) == 1
    assert fresh_run_config(recipe, out, [], steps=100).steps == 100   # a good one moves it aside
    assert not out.exists() and len(list(tmp_path.iterdir())) == 1


def test_quickstart_runs_end_to_end_and_reruns(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    out = tmp_path / "qs"
    sets = [f"model.name={tiny_model_dir}", "model.dtype=float32", "data.eval_n=3", "steps=1",
            "questions_per_step=2", "rollout.n=2", "rollout.max_turn_tokens=8", "rollout.max_response_tokens=40",
            "sft.steps=2", "sft.batch_size=2", "save_every=1"]
    for run in range(2):
        data = run_quickstart(str(out), sets, minutes=None)
        labels = [r["label"] for r in data["rows"]]
        assert labels == ["naive_rag", "agent (untrained)", "agent (SFT)", "agent (SFT + RL)"]
        assert all(r["n"] == 3 for r in data["rows"])
        table = (out / "before_after.md").read_text()
        assert "Differences vs `agent (SFT)`" in table and "agent (SFT + RL)" in table
        assert (out / "training_curves.png").stat().st_size > 0
        assert (out / "rl" / "checkpoints" / "latest").read_text().strip() == "step_000001"
    previous = list(tmp_path.glob("qs.prev-*"))
    assert len(previous) == 1 and (previous[0] / "before_after.md").exists()
