"""MMOA-RAG's rewards: every agent gets the pipeline's answer F1, plus its own penalty.

Released values (configurable): rewriter −0.5 for more than 4 sub-questions or over 300
characters; selector −1 for output that is malformed, out of range or repeats an id; generator −1
for an answer over 30 words. The pipeline runner records which agent acted (`traj.agent`) and
whether its output earned the penalty (`metrics["penalized"]`); this reads only those.

>>> from ragrl.rollout.trajectory import Trajectory
>>> t = Trajectory("q1", "Who?", ["Gian Carlo Menotti"], [], [], [], 0, agent="selector",
...                answer="Menotti", metrics={"penalized": True})
>>> round(mmoa_reward(t, {"answers": ["Gian Carlo Menotti"]}), 4)      # F1 0.5, selector penalty 1
-0.5
>>> t.agent, t.metrics["penalized"] = "rewriter", True
>>> round(mmoa_reward(t, {"answers": ["Gian Carlo Menotti"]}), 4)      # rewriter penalty 0.5
0.0

`selector_gold` (off by default; not in the paper) adds, to the selector's reward only, that
weight times the F1 of its kept documents against the question's gold passages: a dense signal
for a generator too weak for its answers' F1 to say which documents helped.

>>> t.agent, t.metrics = "selector", {"penalized": False, "selector_precision": 0.5, "selector_recall": 1.0}
>>> round(mmoa_reward(t, {"answers": ["Gian Carlo Menotti"]}, selector_gold=1.0), 4)   # 0.5 + F1(0.5, 1)
1.1667
>>> t.agent = "generator"
>>> round(mmoa_reward(t, {"answers": ["Gian Carlo Menotti"]}, selector_gold=1.0), 4)   # other agents: F1 only
0.5

`selector_beta` scores the kept documents by F-beta instead: beta > 1 weighs recall above
precision. It does not by itself stop a selector from learning to keep one document: with two
gold passages, F2 still scores one gold document (0.56) above one gold and one wrong (0.50), so a
second document pays only where it is gold often enough (README, MMOA results).

>>> t.agent = "selector"
>>> round(mmoa_reward(t, {"answers": ["Gian Carlo Menotti"]}, selector_gold=1.0, selector_beta=2.0), 4)  # 0.5 + F2(0.5, 1)
1.3333

`rewriter_gold` (off by default; not in the paper) adds, to the rewriter's reward only, that
weight times the same F-beta of the documents its pipeline kept (its first selection's). The
selectors trained so far keep the first one or two candidates in retrieval order, so what they
keep is what the rewriter's sub-questions retrieve first: this credits the rewriter with it
(README, MMOA: the selector against its retriever's order).

>>> t.agent = "rewriter"
>>> round(mmoa_reward(t, {"answers": ["Gian Carlo Menotti"]}, rewriter_gold=2.0), 4)   # 0.5 + 2 x F1(0.5, 1)
1.8333
>>> round(mmoa_reward(t, {"answers": ["Gian Carlo Menotti"]}, selector_gold=2.0), 4)   # selector_gold: not its
0.5
"""
from __future__ import annotations

from ragrl.errors import ConfigError, RagrlError
from ragrl.methods.mmoa.protocol import selector_f1  # the selector's own score, shared with the pipeline runner
from ragrl.rewards.qa import f1_score, golds_of
from ragrl.rollout.trajectory import Trajectory


def mmoa_reward(completion, sample, rewriter_penalty: float = 0.5, selector_penalty: float = 1.0,
                generator_penalty: float = 1.0, selector_gold: float = 0.0, selector_beta: float = 1.0,
                rewriter_gold: float = 0.0) -> float:
    """Shared answer F1 − the acting agent's penalty when its output earned one (+ the kept
    documents' gold-passage F-beta × `selector_gold` for the selector, × `rewriter_gold` for the
    rewriter)."""
    if not isinstance(completion, Trajectory):
        raise RagrlError("mmoa needs a Trajectory from the pipeline runner (it records the agent)")
    penalties = {"rewriter": rewriter_penalty, "selector": selector_penalty, "generator": generator_penalty}
    if completion.agent not in penalties:
        raise RagrlError(f"mmoa: unknown agent {completion.agent!r}; expected one of {', '.join(penalties)}")
    f1 = f1_score(completion.answer or "", golds_of(completion, sample))
    reward = f1 - (penalties[completion.agent] if completion.metrics.get("penalized") else 0.0)
    weight, name = {"selector": (selector_gold, "selector_gold"),
                    "rewriter": (rewriter_gold, "rewriter_gold")}.get(completion.agent, (0.0, ""))
    if weight:
        if "selector_recall" not in completion.metrics:
            raise RagrlError(f"mmoa {name}: the question has no gold_passage_ids to score the selection "
                             f"against; use training questions with gold passages or {name}=0")
        reward += weight * selector_f1(completion.metrics, selector_beta)
    return reward


def check_mmoa_options(selector_beta: float = 1.0, **weights) -> None:
    if isinstance(selector_beta, bool) or not isinstance(selector_beta, (int, float)) or not selector_beta > 0:
        raise ConfigError(f"reward 'mmoa': selector_beta must be a number > 0, got {selector_beta!r}")
    # The penalties and the gold weights (names already checked by the registry) are numbers: a string
    # would otherwise fail only at the first reward, after the rollout.
    for name, value in weights.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"reward 'mmoa': {name} must be a number, got {value!r}")


