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
    ("rollout.first_action=serch", ["rollout.first_action", "did you mean 'search'"]),
    ("rollout.answer_by=strat", ["rollout.answer_by", "did you mean 'start'"]),
    ("rollout.last_action=anser", ["rollout.last_action", "did you mean 'answer'"]),
    ("rollout.second_action=serch", ["rollout.second_action", "did you mean 'search'"]),
    ("rollout.title_group=evry", ["rollout.title_group", "did you mean 'every'"]),
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
    (["model.reference_adapter=/nonexistent/adapter"], "model.reference_adapter replaces model.init_adapter"),
    (["model.init_adapter=/nonexistent/a", "model.reference_adapter=/nonexistent/adapter"],
     "model.reference_adapter: /nonexistent/adapter is not a LoRA adapter"),
    (["keep_best=f1", "eval_every=0"], "keep_best needs eval_every"),
    (["eval_start=true", "eval_every=0"], "eval_start needs eval_every"),
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
    (["algo.drop_flat_groups=true", "algo.estimator=reinforce_pp_baseline"],
     "algo.drop_flat_groups: .* not reinforce_pp_baseline"),
    (["rollout.end_after_searches=0"], "rollout.end_after_searches must be >= 1, got 0"),
    (["algo.estimator=enumerated"], "algo.estimator=enumerated with rollout.title_group=sample"),
    (["rollout.title_group=every"], "algo.estimator=grpo with rollout.title_group=every"),
    (["rollout.title_group=every", "algo.estimator=enumerated"], "rollout.title_group=every gives each episode"),
    (["rollout.title_notes=first_sentence"], "rollout.title_notes=first_sentence writes the candidate titles' notes"),
    (["rollout.title_notes=first_sentence", "sft.steps=0"], "title_notes=first_sentence notes the candidate titles"),
    (["ema_decay=1.5"], r"ema_decay must be in \[0, 1\)"),
    (["ema_decay=0.9", "shard_params=true"], "ema_decay: weight averaging of FSDP-sharded"),
    (["policy=retriever", "retriever.hops=2", "retriever.generator=smollm2-135m-instruct"], "retriever.hops: with a generator"),
    # HARR's section set in another method's run would be ignored
    (["retriever.hops=2"], "retriever.hops is a setting of HARR, read by its runs only, and this run is search_r1"),
    # the tiny variant's warm start teaches a quarter of direct answers, which a forced search forbids
    (["rollout.first_action=search"], "sft.direct_frac=0.25 teaches answers without a search"),
    (["rollout.first_action=search", "sft.direct_frac=0", "agent=mmoa"], "agent 'mmoa' .* has no multi-turn search"),
    (["rollout.first_action=question"], "sft.direct_frac=0.25 .* rollout.first_action=question never lets"),
    (["rollout.first_action=question", "sft.direct_frac=0", "agent=mmoa"],
     "the runner's own search of the question, but agent 'mmoa' .* has no multi-turn search"),
    (["rollout.first_action=question", "sft.direct_frac=0", "rollout.max_turns=1"],
     "the runner's own search, which leaves the policy none: set max_turns >= 2"),
    (["rollout.first_action=question", "sft.direct_frac=0", "rollout.end_after_searches=1"],
     "rollout.end_after_searches=1 ends every episode at the runner's own search"),
    (["rollout.last_action=answer", "agent=mmoa"], "rollout.last_action=answer .* agent 'mmoa' .* no tagged answer"),
    (["rollout.last_action=answer", "rollout.max_turns=1"], "leaves no turn to search: set max_turns >= 2"),
    (["rollout.second_action=search"], "rollout.second_action=search searches again after a first search, .* "
     "set rollout.first_action=search"),
    (["rollout.second_action=search", "rollout.first_action=search", "sft.direct_frac=0", "rollout.max_turns=2",
      "rollout.last_action=answer"], "leaves none before the forced answer: set max_turns >= 3"),
    (["rollout.answer_by=start", "agent=mmoa"], "rollout.answer_by=start .* agent 'mmoa' .* has no tagged answer"),
    (["rollout.answer_by=start", "model.lora=false"], "rollout.answer_by=start needs model.lora=true"),
    (["rollout.answer_by=start", "model.engine=static"], "rollout.answer_by=start switches LoRA adapters .* model.engine=static"),
    (["rollout.answer_by=base", "model.lora=false"], "rollout.answer_by=base needs model.lora=true"),
    (["rollout.answer_by=base", "agent=mmoa"], "rollout.answer_by=base .* agent 'mmoa' .* has no tagged answer"),
    (["rollout.query_prefix=question", "agent=mmoa"],
     "rollout.query_prefix=question searches the question .* agent 'mmoa' .* has no multi-turn search"),
    (["rollout.query_prefix=question", "sft.steps=0", "rollout.first_action=search", "sft.direct_frac=0",
      "rollout.second_action=search", "rollout.second_query=title", "rollout.last_action=answer"],
     "rollout.second_query=title chooses the second query among titles"),
    (["rollout.query_prefix=question"], "sft.steps=160 writes episodes whose searches are their queries as written"),
    (["rollout.query_prefix=question", "sft.steps=0", "experts_per_group=1"],
     "experts_per_group=1 writes episodes whose searches"),
    (["experts_per_group=-1"], "experts_per_group must be >= 0, got -1"),
    (["experts_per_group=1", "agent=mmoa"], "experts_per_group=1 adds gold search episodes .* agent 'mmoa'"),
    (["experts_per_group=1", "algo.estimator=gae", "algo.value_coef=0.5"],
     "experts_per_group=1: .* algo.estimator=gae compares no group"),
    (["experts_query=missed_gold"], "experts_query=missed_gold says what expert episodes search, but experts_per_group=0"),
    (["experts_per_group=1", "experts_query=missed_gold", "agent=rag_r1"],
     "experts_query=missed_gold writes one query a search; rag_r1 writes"),
])
def test_combinations_that_cannot_work_are_refused_before_any_model_or_rollout(overrides, match, tmp_path, monkeypatch):
    from ragrl.train import setup
    from ragrl.train.trainer import Trainer

    monkeypatch.setattr(setup, "build_setup", lambda *a, **k: pytest.fail("the setup was built"))
    cfg = load_train_config("search_r1_grpo", overrides + [f"out_dir={tmp_path / 'run'}"], "tiny")
    with pytest.raises(ConfigError, match=match):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override,message", [
    ("rollout.n=0", "rollout.n must be >= 1, got 0"),
    ("save_every=0", "save_every must be >= 1, got 0"),          # was a ZeroDivisionError at the first save
    ("keep_last=0", "keep_last must be >= 1, got 0"),            # was refused only when the first checkpoint was written
    ("questions_per_step=0", "questions_per_step must be >= 1, got 0"),
    ("lr=0", "lr must be > 0, got 0"),
    ("lr=nan", "lr must be > 0, got nan"),                       # every comparison with NaN is false
    ("max_grad_norm=.inf", "max_grad_norm must be > 0, got inf"),
    ("rollout.temperature=-0.5", "rollout.temperature must be >= 0, got -0.5"),
    ("rollout.top_p=0", r"rollout.top_p must be in \(0, 1\], got 0"),
    ("algo.gamma=1.5", r"algo.gamma must be in \[0, 1\], got 1.5"),
    ("algo.clip_low=1", r"algo.clip_low must be in \[0, 1\), got 1"),   # was refused at the first update
    ("model.lora_dropout=1.0", r"model.lora_dropout must be in \[0, 1\), got 1.0"),
    ("sft.direct_frac=1.0", r"sft.direct_frac must be in \[0, 1\), got 1.0"),   # was refused after the model loaded
    ("algo.entropy_coef=-0.01", "algo.entropy_coef must be >= 0, got -0.01"),   # was never applied
    ("algo.minibatch_size=-2", "algo.minibatch_size must be >= 1, got -2"),
    ("algo.dual_clip=0.5", "algo.dual_clip must be > 1, got 0.5"),
    ("retriever.hops=0", "retriever.hops must be >= 1, got 0"),
])
def test_a_number_outside_its_range_is_refused_by_check_naming_the_setting_and_range(override, message):
    from ragrl.train.check import check_combinations

    cfg = load_train_config("search_r1_grpo", [override], "tiny")   # the typed loader accepts it: an int, a float
    with pytest.raises(ConfigError, match=message):
        check_combinations(cfg)


@pytest.mark.parametrize("override", ["rollout.temperature=0", "rollout.top_p=1", "algo.gamma=0", "algo.lam=1",
                                      "rollout.max_searches=0", "algo.clip_low=0", "warmup_steps=0", "eval_every=0",
                                      "algo.kl_coef=0", "ema_decay=0", "steps=1", "algo.dual_clip=1.5"])
def test_the_edge_of_each_range_is_accepted(override):
    from ragrl.train.check import check_ranges

    check_ranges(load_train_config("search_r1_grpo", [override], "tiny"))


def test_every_numeric_setting_has_a_range_or_is_left_out_on_purpose():
    """A numeric field added to a config later must get a range here (or be named as free)."""
    import dataclasses
    import typing

    from ragrl.train.check import all_ranges
    from ragrl.train.config import TrainConfig

    free = {"seed", "rollout.seed", "mmoa.selector_samples", "mmoa.generator_samples"}   # any integer; checked by its method

    def numeric(cls, prefix=""):
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                yield from numeric(tp, f"{prefix}{f.name}.")
            elif {int, float} & set(typing.get_args(tp) or (tp,)) and tp is not bool:
                yield prefix + f.name

    fields = set(numeric(TrainConfig))
    assert len(fields) > 40
    assert fields - free == set(all_ranges()), (fields - free) ^ set(all_ranges())


def test_every_shipped_recipe_and_variant_is_within_the_ranges():
    """The ranges must not refuse a recipe ragrl ships (a range too tight would be a bug of its own)."""
    from ragrl.yaml_config import read_recipe
    from ragrl.train.check import all_ranges, check_ranges
    from ragrl.train.recipe import resolve_recipe

    checked = 0
    for path in sorted(resolve_recipe("search_r1_grpo").parent.glob("*.yaml")):
        variants = [None, *(read_recipe(path).get("variants") or {})]
        for variant in variants:
            check_ranges(load_train_config(str(path), [], variant))
            checked += 1
    assert checked >= 9 + 5 and len(all_ranges()) > 40


def test_an_engine_that_cannot_run_here_is_refused_naming_what_is_missing(tmp_path, monkeypatch):
    from ragrl.engines.vllm import vllm_available
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


@pytest.mark.parametrize("override,message", [("sft.batch_size=0", "sft.batch_size must be >= 1, got 0"),
                                              ("sft.lr=-1e-4", "sft.lr must be > 0, got -0.0001")])
def test_ragrl_sft_refuses_a_number_out_of_range_before_loading_the_model(override, message, monkeypatch, capsys):
    from ragrl.cli.main import main
    from ragrl.policy import lm_model as policy

    monkeypatch.setattr(policy, "build_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.setattr(sys, "argv", ["ragrl", "sft", "search_r1_grpo", "--variant", "tiny", "--set", "sft.steps=2",
                                      "--set", override])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err
