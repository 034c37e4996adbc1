"""An override of `reward` under a recipe whose variant sets a reward_schedule would never be used:
it is refused, naming the override and what to set instead; a schedule override is taken."""
import pytest

from ragrl.errors import ConfigError
from ragrl.train.recipe import load_train_config


def test_a_reward_override_under_a_schedule_is_refused():
    with pytest.raises(ConfigError, match=r"'reward.answer_rank=1.0': this recipe's reward_schedule replaces"):
        load_train_config("harr_grpo", ["reward.answer_rank=1.0"], "tiny")
    cfg = load_train_config("harr_grpo", ["reward_schedule=[[0, {answer_rank: 1.0}]]"], "tiny")
    assert cfg.reward_schedule == [[0, {"answer_rank": 1.0}]]
    # without a schedule, `reward` is what is trained on, and its override stays allowed
    assert load_train_config("search_r1_grpo", ["reward.answer_rank=0.5"], "tiny").reward["answer_rank"] == 0.5
