"""SmartRAG (Gao et al., ICLR 2025): one policy decides each step to retrieve (with a rewritten
query) or to answer; reward EM + F1 - cost per retrieval; SFT warm start, then PPO."""
from __future__ import annotations

import inspect

from ragrl.errors import ConfigError
from ragrl.methods.base import Method, register_method
from ragrl.methods.smartrag.protocol import SmartRAGProtocol
from ragrl.methods.smartrag.reward import smartrag_reward
from ragrl.methods.smartrag.settings import MOVED_KEYS, SmartRAGSettings
from ragrl.methods.smartrag.sft import smartrag_episodes
from ragrl.rewards.registry import make_reward


def check_smartrag_settings(cfg, settings: SmartRAGSettings) -> None:
    """`smartrag.known_if` is read by SmartRAG's builder alone; its reward already charges retrievals."""
    if settings.known_if != "em" and cfg.sft.builder != "smartrag":
        raise ConfigError(f"smartrag.known_if={settings.known_if} is read only by sft.builder=smartrag (the builder "
                          f"is {cfg.sft.builder}); drop it or set sft.builder=smartrag")
    for start, spec in (cfg.reward_schedule or [[0, cfg.reward]]):
        names = {t.name for t in make_reward(spec).terms}
        if {"smartrag", "search_cost"} <= names:
            raise ConfigError(f"reward (from step {start}): smartrag already charges its cost per retrieval, so "
                              "search_cost would charge it twice; set reward.smartrag.cost instead")


def smartrag_cost(cfg) -> float | None:
    """The cost per retrieval its reward charges (the last schedule entry's, as training ended)."""
    spec = cfg.reward_schedule[-1][1] if cfg.reward_schedule else cfg.reward
    terms = [t for t in make_reward(spec).terms if t.name == "smartrag"]
    default = inspect.signature(smartrag_reward).parameters["cost"].default
    return float(terms[0].weight * terms[0].options.get("cost", default)) if terms else None


METHOD = register_method(Method(
    name="smartrag",
    paper="SmartRAG (Gao et al., ICLR 2025)",
    trains="one LM that decides retrieve-or-answer, rewrites queries and answers (SFT, then PPO)",
    protocols=(SmartRAGProtocol,),
    rewards={"smartrag": smartrag_reward},
    answer_rewards=("smartrag",),
    sft_builders={"smartrag": smartrag_episodes},
    settings=SmartRAGSettings,
    moved_keys=MOVED_KEYS,
    check=check_smartrag_settings,
    retrieval_cost=smartrag_cost,
    recipes=("smartrag_ppo",),
))
