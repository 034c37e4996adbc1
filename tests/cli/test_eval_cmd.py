"""`ragrl eval` end to end on the tiny model and a real BM25 index; bad input gives one clear line."""
import json
import sys

import pytest
from typer.testing import CliRunner

from ragrl.cli.main import app, main
from ragrl.eval.report import load_trajectories, recompute_summary


def test_eval_writes_a_complete_report(tiny_model_dir, demo_bm25_dir, tmp_path):
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, [
        "eval", "--model", str(tiny_model_dir), "--index", str(demo_bm25_dir), "--n", "4",
        "--systems", "direct,naive_rag,agent", "--max-turns", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert set(report["systems"]) == {"direct", "naive_rag", "search_r1"}
    assert report["meta"]["n"] == 4 and report["meta"]["model"] == str(tiny_model_dir)
    assert report["meta"]["weights"] == "float32"
    assert report["baseline"] == "naive_rag" and set(report["paired"]) == {"direct", "search_r1"}
    for system, summary in report["systems"].items():
        jsonl = out / f"trajectories_{system}.jsonl"
        assert report["files"][system] == jsonl.name
        trajs = load_trajectories(jsonl)
        assert len(trajs) == 4 and all(t.sample_id for t in trajs)
        assert recompute_summary(jsonl, wall_time_s=summary["wall_time_s"]) == summary
    assert all(t.num_turns <= 2 for t in load_trajectories(out / "trajectories_search_r1.jsonl"))
    md = (out / "report.md").read_text()
    assert md.startswith("# ragrl eval report") and "| search_r1 |" in md and "Differences vs `naive_rag`" in md
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "report:" in result.output


def run_main(monkeypatch, capsys, args) -> tuple[int, str]:
    """Run the real console entry point in-process; (exit code, stderr + stdout)."""
    monkeypatch.setattr(sys, "argv", ["ragrl", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.err + captured.out


@pytest.mark.parametrize("args,names", [
    (["--systems", "direct,bogus"], "bogus"),
    (["--data", "/nonexistent/questions.jsonl"], "/nonexistent/questions.jsonl"),
    (["--device", "tpu"], "--device"),
    (["--engine", "vlm"], "--engine"),
    (["--dtype", "float16"], "--dtype"),
], ids=["bad --systems", "missing --data", "bad --device", "bad --engine", "bad --dtype"])
def test_bad_input_is_one_error_line_without_traceback(monkeypatch, capsys, tmp_path, tiny_model_dir, args, names):
    code, output = run_main(monkeypatch, capsys, ["eval", "--model", str(tiny_model_dir), "--n", "2",
                                                  "--out", str(tmp_path / "never"), *args])
    assert code != 0
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and names in errors[0]
    assert not (tmp_path / "never").exists()  # failed before any work


def test_eval_run_whose_answers_its_start_writes_loads_that_start_or_says_it_is_missing(
        monkeypatch, capsys, tmp_path, tiny_model_dir, demo_bm25_dir, small_dense_dir):
    """`rollout.answer_by: start`: `eval --run` loads the frozen start the run saved beside its adapter
    (`reference/`), as `compare` does; a run folder without it is refused in one line, since the base
    model would otherwise answer in the start's place."""
    import shutil

    from ragrl.train.recipe import load_train_config, run_recipe
    from tests.train.test_recipe import one_step_overrides

    base = load_train_config("search_r1_grpo", [], "tiny")
    sets = one_step_overrides(base, tmp_path / "run", tiny_model_dir, demo_bm25_dir, small_dense_dir)
    run = run_recipe(load_train_config("search_r1_grpo", sets + ["rollout.answer_by=start"], "tiny"))
    result = CliRunner().invoke(app, ["eval", "--run", str(run), "--systems", "agent", "--n", "2",
                                      "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["meta"]["rollout"]["answer_by"] == "start" and report["meta"]["run"] == str(run)
    assert len(load_trajectories(tmp_path / "eval" / "trajectories_search_r1.jsonl")) == 2

    shutil.rmtree(run / "final_adapter" / "reference")
    code, output = run_main(monkeypatch, capsys, ["eval", "--run", str(run), "--systems", "agent", "--n", "2",
                                                  "--out", str(tmp_path / "never")])
    assert code != 0 and "Traceback" not in output
    errors = [line for line in output.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and "reference" in errors[0] and "answer_by=start" in errors[0]
