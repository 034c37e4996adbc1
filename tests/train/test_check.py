"""A recipe or flag ragrl cannot honour is refused before any work, naming what is wrong."""
import os
import subprocess
import sys
import time

import pytest

from ragrl.errors import ConfigError
from ragrl.train.recipe import load_train_config


@pytest.mark.parametrize("override,names", [
    ("lr_schedule=linaer", ["lr_schedule", "did you mean 'linear'"]),
    ("algo.estimator=grpoo", ["algo.estimator", "did you mean 'grpo'"]),
    ("algo.loss_agg=token-mean", ["algo.loss_agg", "did you mean 'token_mean'"]),
    ("model.engine=vlm", ["model.engine", "did you mean 'vllm'"]),
    ("model.dtype=bf16", ["model.dtype", "float32, bfloat16, float16, auto"]),
    ("policy=retreiver", ["policy", "did you mean 'retriever'"]),
    ("data.shuffle=false", ["data.shuffle"]),
])
def test_a_bad_setting_is_refused_when_the_config_resolves(override, names):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_train_config("search_r1_grpo", [override], "tiny")
    assert all(n in str(err.value) for n in names), str(err.value)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("overrides,match", [
    (["algo.kl_in_reward=true", "algo.kl_coef=0.05"], "algo.kl_in_reward: the grpo estimator"),
    (["model.init_adapter=/nonexistent/adapter"], "model.init_adapter: /nonexistent/adapter is not a LoRA adapter"),
    (["keep_best=f1", "eval_every=0"], "keep_best needs eval_every"),
    (["algo.kl_target=0.2", "algo.kl_coef=0"], "algo.kl_target"),
    (["algo.value_coef=0.5"], "algo.value_coef: the grpo estimator has no critic"),
    (["algo.value_clip=0.1"], "algo.value_clip: the grpo estimator has no critic"),
    (["algo.estimator=gae", "algo.value_coef=0"], "algo.value_coef: gae reads its critic"),
    (["model.engine=vllm", "shard_params=true"], "model.engine=vllm"),
    (["critic_warmup=2"], "critic_warmup: the grpo estimator has no critic"),
    (["algo.estimator=gae_baseline", "rollout.n=1"], "with rollout.n=1 every advantage is 0"),
    (["rollout.n=1"], "algo.estimator=grpo compares each sample"),
    (["algo.estimator=reinforce_pp_baseline", "rollout.n=1"], "algo.estimator=reinforce_pp_baseline compares"),
    (["algo.estimator=rloo", "algo.kl_in_reward=true", "algo.kl_coef=0.05"], "algo.kl_in_reward: the rloo"),
    (["algo.estimator=gae_baseline", "algo.value_coef=0"], "algo.value_coef: gae_baseline reads its critic"),
    (["algo.estimator=gae", "critic_warmup=5", "steps=5"], "critic_warmup must be between 1 and steps - 1"),
    (["ema_decay=1.5"], r"ema_decay must be in \[0, 1\)"),
    (["ema_decay=0.9", "shard_params=true"], "ema_decay: weight averaging of FSDP-sharded"),
    (["retriever.hops=0"], "retriever.hops must be >= 1"),
    (["retriever.hops=2", "retriever.generator=smollm2-135m-instruct"], "retriever.hops: with a generator"),
])
def test_combinations_that_cannot_work_are_refused_before_any_model_or_rollout(overrides, match, tmp_path, monkeypatch):
    from ragrl.train import setup
    from ragrl.train.trainer import Trainer

    monkeypatch.setattr(setup, "build_setup", lambda *a, **k: pytest.fail("the setup was built"))
    cfg = load_train_config("search_r1_grpo", overrides + [f"out_dir={tmp_path / 'run'}"], "tiny")
    with pytest.raises(ConfigError, match=match):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()


def test_an_engine_that_cannot_run_here_is_refused_naming_what_is_missing(tmp_path, monkeypatch):
    from ragrl.rollout.vllm_engine import vllm_available
    from ragrl.train import setup
    from ragrl.train.trainer import Trainer

    if vllm_available():
        pytest.skip("vLLM and a GPU are here: nothing is missing")
    monkeypatch.setattr(setup, "build_setup", lambda *a, **k: pytest.fail("the setup was built"))
    cfg = load_train_config("search_r1_grpo", ["model.engine=vllm", f"out_dir={tmp_path / 'run'}"], "tiny")
    with pytest.raises(ConfigError, match=r"model.engine=vllm: (vllm is not installed \(pip install 'ragrl\[vllm\]'\)"
                                          r"|no CUDA GPU is visible)"):
        Trainer(cfg)


def test_an_index_built_over_another_corpus_is_refused(tmp_path, demo_bm25_dir, monkeypatch):
    from ragrl.train import setup
    from ragrl.train.trainer import Trainer

    other = tmp_path / "other.jsonl"
    other.write_text('{"id": "p1", "title": "A", "text": "another corpus"}\n')
    monkeypatch.setattr(setup, "build_setup", lambda *a, **k: pytest.fail("the setup was built"))
    cfg = load_train_config("search_r1_grpo", [f"data.index={demo_bm25_dir}", f"data.corpus={other}",
                                               f"out_dir={tmp_path / 'run'}"], "tiny")
    with pytest.raises(ConfigError, match=r"data.index: .* whose contents differ from data.corpus"):
        Trainer(cfg)
    # the index's own corpus passes the check
    import json
    manifest = json.loads((demo_bm25_dir / "manifest.json").read_text())
    from ragrl.train.check import check_index_matches_corpus
    check_index_matches_corpus(load_train_config("search_r1_grpo", [f"data.index={demo_bm25_dir}",
                                                                    f"data.corpus={manifest['corpus_path']}"], "tiny"))


def test_a_retriever_policy_without_a_generator_refuses_an_answer_reward(tmp_path):
    from ragrl.train.trainer import Trainer

    cfg = load_train_config("harr_grpo", ["reward_schedule=[]", f"out_dir={tmp_path / 'run'}"], "tiny")
    with pytest.raises(ConfigError, match="reward f1 .* retriever.generator is null"):
        Trainer(cfg)


def test_a_typo_in_a_reward_option_is_refused_before_the_sft_warm_start(tmp_path, monkeypatch):
    from ragrl.train import recipe

    # smartrag_ppo warm-starts by SFT (minutes on a CPU): the typo must fail before it
    monkeypatch.setattr(recipe, "sft_warm_start", lambda *a, **k: pytest.fail("the SFT warm start ran"))
    cfg = load_train_config("smartrag_ppo", ["reward.smartrag.cots=0.1", f"out_dir={tmp_path / 'run'}"], "tiny")
    with pytest.raises(ConfigError, match=r"reward 'smartrag': unknown option\(s\) \['cots'\]; it takes .*'cost'"):
        recipe.run_recipe(cfg)
    assert not (tmp_path / "run").exists()
    # the retrieval cost is smartrag's own option: a second search_cost term would charge it twice
    cfg = load_train_config("smartrag_ppo", ["reward.search_cost=0.5", f"out_dir={tmp_path / 'run'}"], "tiny")
    with pytest.raises(ConfigError, match="smartrag already charges its cost per retrieval.*reward.smartrag.cost"):
        recipe.run_recipe(cfg)
    assert not (tmp_path / "run").exists()


def test_check_flag_validates_and_trains_nothing(tmp_path, demo_bm25_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "ragrl.cli.main", "train", "search_r1_grpo", "--variant", "tiny", "--check",
           "--set", f"data.index={demo_bm25_dir}", "--set", f"out_dir={tmp_path / 'run'}"]
    ok = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "ok  data.train: 913 questions" in ok.stdout and "nothing was trained" in ok.stdout
    assert not (tmp_path / "run").exists()
    bad = subprocess.run(cmd + ["--set", "data.eval=/nonexistent.jsonl"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "/nonexistent.jsonl" in bad.stderr and "Traceback" not in bad.stderr
