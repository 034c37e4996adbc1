"""Rewards by name, combined with weights: what a recipe's `reward:` block resolves to.

A spec maps names to weights, or to a dict of a weight and the reward's options:

    {"f1": 1.0, "search_cost": {"weight": 1.0, "cost": 0.05}}
    [{"name": "f1", "weight": 1.0}, {"name": "search_cost", "cost": 0.05}]   # the same

>>> reward = make_reward({"em": 1.0, "search_cost": {"weight": 2.0, "cost": 0.1}})
>>> text = "<search> q </search><information>d</information><answer>Paris</answer>"
>>> round(reward(text, {"answers": ["Paris"]}), 6)
0.8
>>> reward_breakdown(text, {"answers": ["Paris"]}, {"em": 1.0, "format": 0.5})
{'em': 1.0, 'format': 1.0, 'total': 1.5}
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ragrl.errors import ConfigError
from ragrl.registry import Registry
from ragrl.rewards.format import format_reward
from ragrl.rewards.qa import cover_em_reward, em_reward, f1_reward
from ragrl.rewards.search import (
    QUERY_RANK_TIERS,
    answer_in_docs_reward,
    answer_rank_reward,
    check_answer_rank,
    check_query_rank,
    check_search_gain,
    gold_recall_reward,
    query_rank_reward,
    retrieval_reward,
    search_cost_reward,
    search_gain_reward,
)
from ragrl.rollout.protocol import get_protocol

RewardFn = Callable[..., float]

# The generic rewards; each method record adds its own (search_r1_format, smartrag, mmoa, ...).
REWARDS: Registry[RewardFn] = Registry("reward", {
    "em": em_reward,
    "f1": f1_reward,
    "cover_em": cover_em_reward,
    "format": format_reward,
    "search_cost": search_cost_reward,
    "retrieval": retrieval_reward,
    "gold_recall": gold_recall_reward,
    "answer_in_docs": answer_in_docs_reward,
    "answer_rank": answer_rank_reward,
    "search_gain": search_gain_reward,
    "query_rank": query_rank_reward,
})
# The generic rewards that score a generated answer or its format (each method declares its own).
ANSWER_REWARDS = ("em", "f1", "cover_em", "format")
# Checks of a reward's option *values* (not only their names), run when a recipe is loaded.
REWARD_CHECKS: Registry[Callable[..., None]] = Registry("reward option check", {"answer_rank": check_answer_rank,
                                                                           "search_gain": check_search_gain,
                                                                           "query_rank": check_query_rank})
# Rewards that read the retrieved passages' own texts (Turn.passage_texts), which the multi-turn and
# retrieval-only runners record: refused on load for a protocol played by another runner.
PASSAGE_TEXT_REWARDS = ("answer_rank", "search_gain")


@dataclass
class RewardTerm:
    name: str
    weight: float
    options: dict[str, Any] = field(default_factory=dict)

    def __call__(self, completion, sample) -> float:
        return float(REWARDS[self.name](completion, sample, **self.options))


class CombinedReward:
    """Σ weight · reward(completion, sample) over the spec's terms."""

    def __init__(self, terms: list[RewardTerm]):
        self.terms = terms

    def __call__(self, completion, sample) -> float:
        return sum(term.weight * term(completion, sample) for term in self.terms)

    def needs(self, flag: str) -> bool:
        """Whether a term's reward function declares `flag` (e.g. needs_question_rank: the trainer
        must annotate the samples before scoring)."""
        return any(getattr(REWARDS[t.name], flag, False) for t in self.terms)

    def breakdown(self, completion, sample) -> dict[str, float]:
        """Each term's unweighted value, plus the weighted `total` (for logging)."""
        values = {term.name: term(completion, sample) for term in self.terms}
        values["total"] = sum(term.weight * values[term.name] for term in self.terms)
        return values

    def __repr__(self) -> str:
        return "CombinedReward(" + ", ".join(f"{t.weight:g}*{t.name}{t.options or ''}" for t in self.terms) + ")"


def _term(name: Any, value: Any) -> RewardTerm:
    fn = REWARDS[name]   # an unknown name is refused here, with the known ones and the nearest
    options = dict(value) if isinstance(value, dict) else {"weight": value}
    weight = options.pop("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ConfigError(f"reward {name!r}: weight must be a finite number, got {weight!r}")
    try:  # check the options now, not in the middle of a training step
        inspect.signature(fn).bind(None, None, **options)
    except TypeError:
        allowed = [p for p in inspect.signature(fn).parameters if p not in ("completion", "sample")]
        unknown = sorted(set(options) - set(allowed))
        what = f"unknown option(s) {unknown}" if unknown else f"bad options {sorted(options)}"
        raise ConfigError(f"reward {name!r}: {what}; it takes weight and {allowed or 'nothing else'}") from None
    check = REWARD_CHECKS.get(name)   # values, not only names, before any rollout
    if check is not None:
        check(**options)
    if "protocol" in options and options["protocol"] is not None:
        get_protocol(options["protocol"])  # an unknown protocol name fails here, clearly
    return RewardTerm(name, float(weight), options)


def make_reward(spec) -> CombinedReward:
    """Compile a reward spec (dict or list form, see the module docstring)."""
    if isinstance(spec, CombinedReward):
        return spec
    if isinstance(spec, dict):
        items = list(spec.items())
    elif isinstance(spec, list):
        items = []
        for entry in spec:
            if not isinstance(entry, dict) or "name" not in entry:
                raise ConfigError(f"each reward in a list needs a 'name', got {entry!r}")
            entry = dict(entry)
            items.append((entry.pop("name"), entry))
    else:
        raise ConfigError(f"a reward spec must be a dict or a list, got {type(spec).__name__}")
    if not items:
        raise ConfigError("the reward spec is empty; name at least one reward")
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise ConfigError(f"a reward is named twice in {names}")
    return CombinedReward([_term(name, value) for name, value in items])


def reward_needs(reward, flag: str) -> bool:
    """Whether a compiled reward declares `flag` (any plain callable declares nothing)."""
    return isinstance(reward, CombinedReward) and reward.needs(flag)


def query_rank_depth(reward) -> int:
    """How deep the trainer searches each episode's queries again for a compiled reward's query_rank
    terms: the deepest tier's bound over them (0: no such term, nothing to search)."""
    if not isinstance(reward, CombinedReward):
        return 0
    return max((max(bound for bound, _ in t.options.get("tiers", QUERY_RANK_TIERS)) for t in reward.terms
                if getattr(REWARDS[t.name], "needs_query_rank", False)), default=0)


def reward_breakdown(completion, sample, spec) -> dict[str, float]:
    """Each reward's unweighted value and the weighted total, for logging."""
    return make_reward(spec).breakdown(completion, sample)
