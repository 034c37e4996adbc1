"""Rewards: plain functions `f(completion, sample) -> float`, composed by name in a recipe.

The generic ones live here; a method's own rewards live with the method (ragrl.methods) and
are registered in REWARDS by its record.
"""
from ragrl.rewards.format import format_reward, is_well_formed
from ragrl.rewards.qa import (
    answer_of,
    cover_em,
    cover_em_reward,
    em_reward,
    exact_match,
    f1_reward,
    f1_score,
    golds_of,
    normalize_answer,
    response_text,
)
from ragrl.rewards.registry import REWARDS, CombinedReward, make_reward, reward_breakdown
from ragrl.rewards.schedule import RewardSchedule
from ragrl.rewards.search import (
    answer_in_docs_reward,
    gold_recall_reward,
    retrieval_reward,
    search_cost_reward,
    search_count,
)

__all__ = [
    "answer_of", "golds_of", "response_text", "normalize_answer", "exact_match", "f1_score",
    "cover_em", "em_reward", "f1_reward", "cover_em_reward", "format_reward", "is_well_formed",
    "search_count", "search_cost_reward", "retrieval_reward", "gold_recall_reward",
    "answer_in_docs_reward", "REWARDS", "CombinedReward", "make_reward", "reward_breakdown", "RewardSchedule",
]
