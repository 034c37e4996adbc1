"""`ragrl train RECIPE [--variant V] [--set k=v] --explain [KEY]`: each setting's value in the resolved
recipe, its default, allowed values and help, as plain text, from the config alone (no model, data
or index is opened); an unknown KEY is one error line naming it and the closest keys."""
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import ragrl.policy.lm_model
import ragrl.methods.synthetic
import ragrl.train.check
import ragrl.train.recipe
import ragrl.train.trainer
from ragrl.cli.main import app, main
from ragrl.train.recipe import load_train_config


def run_main(monkeypatch, capsys, args) -> tuple[int, str]:
    """Run the real console entry point in-process; (exit code, stderr + stdout)."""
    monkeypatch.setattr(sys, "argv", ["ragrl", *args])
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.err + captured.out


@pytest.fixture
def nothing_loads(monkeypatch):
    """--explain must not train, load a model or read questions: any of them fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("--explain loaded or ran something")
    monkeypatch.setattr(ragrl.train.recipe, "run_recipe", refuse)
    monkeypatch.setattr(ragrl.policy.lm_model, "build_policy", refuse)
    monkeypatch.setattr(ragrl.policy.lm_model, "load_policy", refuse)
    for module in (ragrl.train.trainer, ragrl.train.check, ragrl.methods.synthetic):   # every reader of questions
        monkeypatch.setattr(module, "load_questions", refuse)


def test_explain_one_key_gives_the_variants_value_default_allowed_values_and_help(nothing_loads):
    result = CliRunner().invoke(app, ["train", "search_r1_grpo", "--variant", "tiny", "--explain", "rollout.n"])
    assert result.exit_code == 0, result.output
    n = load_train_config("search_r1_grpo", [], "tiny").rollout.n
    assert result.output.splitlines()[:2] == [f"rollout.n = {n}  (int; default 4)", "    allowed: >= 1"]
    assert "Samples per question" in result.output and "\x1b[" not in result.output


def test_explain_a_section_with_overrides(nothing_loads):
    result = CliRunner().invoke(app, ["train", "search_r1_grpo", "--set", "algo.kl_coef=0.05", "--explain", "algo"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("[algo] The RL update")
    keys = [line.split(" = ")[0] for line in lines if " = " in line and not line.startswith(" ")]
    assert keys[0] == "algo.estimator" and all(k.startswith("algo.") for k in keys) and len(keys) > 15
    assert "algo.kl_coef = 0.05  (float; default 0.0)" in lines
    assert "    allowed: gae, gae_baseline, grpo, dr_grpo, rloo, enumerated, reinforce_pp, reinforce_pp_baseline" in lines


def test_explain_with_no_key_lists_every_setting(nothing_loads):
    result = CliRunner().invoke(app, ["train", "smartrag_ppo", "--explain"])
    assert result.exit_code == 0, result.output
    out = result.output
    for header in ("[top level]", "[model]", "[data]", "[algo]", "[rollout]", "[sft]", "[retriever]", "[guard]"):
        assert f"\n{header} " in f"\n{out}", header
    cfg = load_train_config("smartrag_ppo", [], None)
    assert f"algo.estimator = {cfg.algo.estimator}  (str; default grpo)" in out
    assert "model.dtype = " in out and "allowed: float32, bfloat16, float16, auto" in out
    assert CliRunner().invoke(app, ["train", "smartrag_ppo", "--explain", "all"]).output == out


def test_an_unknown_key_is_refused_naming_it_and_close_matches(monkeypatch, capsys):
    code, out = run_main(monkeypatch, capsys, ["train", "search_r1_grpo", "--explain", "algo.estimatr"])
    assert code == 2
    assert "error: unknown setting 'algo.estimatr'; did you mean 'algo.estimator'" in out
    assert "Traceback" not in out


def test_a_key_without_explain_is_refused(monkeypatch, capsys):
    code, out = run_main(monkeypatch, capsys, ["train", "search_r1_grpo", "algo.estimator"])
    assert code == 2 and "--explain" in out and "algo.estimator" in out


def test_explain_through_the_console_script_into_a_pipe(tmp_path):
    """The installed entry point, stdout a pipe (not a terminal): plain lines, exit 0."""
    env = {**os.environ, "RAGRL_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "ragrl.cli.main", "train", "search_r1_grpo", "--variant", "tiny",
                          "--set", "model.dtype=bfloat16", "--explain", "model.dtype"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("model.dtype = bfloat16  (str; default float32)\n")
    assert "allowed: float32, bfloat16, float16, auto" in out.stdout and "\x1b[" not in out.stdout
