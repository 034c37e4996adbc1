"""Collapse and NaN guards: what the trainer watches after every step, and the remedy it applies.

    watch = CollapseWatch(cfg.guard)
    trip = watch.observe(step, row)     # None, or the rule that tripped (after `patience` steps)

The rules are the shapes collapses take in GRPO/PPO runs of this field (Search-R1 #88, ZeroSearch
#23): the policy's entropy falls under a floor, its KL to the reference climbs over a ceiling, its
format-error rate climbs, its mean reward falls far below its recent level, or its updates go
non-finite step after step. A single non-finite update is never taken (`update.py` skips it); the
"nonfinite" rule trips when every update of `nonfinite_steps` steps in a row was skipped.

When a rule trips, the trainer restores the newest intact checkpoint (weights, optimizer, scheduler,
RNG), applies the remedy (`remedy_lr_factor`, `remedy_skip_questions`) and goes on; after
`max_rollbacks` rollbacks it stops (TrainingCollapsed). The remedy's state (rollbacks, the learning
rate's scale, the questions left out) survives the rollback and is checkpointed; the rules' history
(the recent rewards, the streaks) is the checkpoint's, so a resumed run watches exactly as before.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ragrl.train.config import GuardConfig

# The order in which rules are reported when several hold at once: the most specific first.
RULES = ("nonfinite", "kl_ceiling", "entropy_floor", "format_error_ceiling", "reward_drop")


@dataclass
class Trip:
    """A rule that held for its patience: what it watched, the value and the threshold."""

    rule: str
    step: int
    value: float
    threshold: float

    def describe(self) -> str:
        """One sentence for the log and the error message.

        >>> Trip("reward_drop", 12, 0.1, 0.35).describe()
        'guard rule reward_drop tripped at step 12: mean reward 0.1 fell under its recent level less reward_drop (0.35)'
        """
        what = {
            "nonfinite": f"{self.value:g} steps in a row had every update skipped for a non-finite loss or "
                         f"gradient (nonfinite_steps {self.threshold:g})",
            "kl_ceiling": f"KL to the reference {self.value:.4g} is over kl_ceiling {self.threshold:g}",
            "entropy_floor": f"sampled-action entropy {self.value:.4g} is under entropy_floor {self.threshold:g}",
            "format_error_ceiling": f"format-error rate {self.value:.4g} is over format_error_ceiling {self.threshold:g}",
            "reward_drop": f"mean reward {self.value:.4g} fell under its recent level less reward_drop "
                           f"({self.threshold:.4g})",
        }[self.rule]
        return f"guard rule {self.rule} tripped at step {self.step}: {what}"


def sampled_entropy(logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """The policy's entropy estimated from its own samples: the mean of −log π(a) over actions.

    logprobs: [B, L] log-probs of the sampled actions under the sampling policy (0 off the mask);
    mask: [B, L], 1 on actions. A free Monte-Carlo estimate (no extra forward), the same for an LM
    (per token) and a retriever (per Plackett–Luce draw); a policy that has collapsed onto one
    action scores ~0. Returns nan when there is no action.

    >>> sampled_entropy(torch.tensor([[-1.0, -3.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    2.0
    """
    n = float(mask.sum())
    return float(-(logprobs * mask).sum()) / n if n else float("nan")


class CollapseWatch:
    """The collapse rules over the steps' rows, and the remedy's state."""

    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        # History: the checkpoint's own (restored on resume and on rollback).
        self.recent: list[float] = []          # mean rewards of the last `window` steps
        self.streaks: dict[str, int] = {}      # steps in a row each rule has held
        # Remedy: carried across a rollback, checkpointed.
        self.rollbacks = 0
        self.lr_scale = 1.0
        self.skipped_ids: list[str] = []

    def readings(self, row: dict) -> dict[str, tuple[float, float, bool]]:
        """{rule: (value, threshold, holds)} for every rule that is on and has a value this step."""
        c, out = self.cfg, {}
        if row.get("updates") == 0 and row.get("guard/nonfinite_skipped", 0) > 0:
            out["nonfinite"] = (1.0, float(c.nonfinite_steps), True)
        if c.kl_ceiling is not None and "kl_ref" in row:
            out["kl_ceiling"] = (row["kl_ref"], c.kl_ceiling, row["kl_ref"] > c.kl_ceiling)
        entropy = row.get("action_entropy")
        if c.entropy_floor is not None and entropy is not None and math.isfinite(entropy):
            out["entropy_floor"] = (entropy, c.entropy_floor, entropy < c.entropy_floor)
        if c.format_error_ceiling is not None:
            rate = row["format_error_rate"]
            out["format_error_ceiling"] = (rate, c.format_error_ceiling, rate > c.format_error_ceiling)
        if c.reward_drop is not None and len(self.recent) >= c.window:
            level = sum(self.recent) / len(self.recent)
            out["reward_drop"] = (row["reward_mean"], level - c.reward_drop, row["reward_mean"] < level - c.reward_drop)
        return out

    def observe(self, step: int, row: dict) -> Trip | None:
        """Update the streaks with this step's row; the first rule whose streak reached its patience."""
        held = self.readings(row)
        for rule in RULES:
            self.streaks[rule] = self.streaks.get(rule, 0) + 1 if held.get(rule, (0, 0, False))[2] else 0
        for rule in RULES:
            need = self.cfg.nonfinite_steps if rule == "nonfinite" else self.cfg.patience
            if rule in held and self.streaks[rule] >= need:
                value = float(self.streaks[rule]) if rule == "nonfinite" else held[rule][0]
                return Trip(rule, step, value, held[rule][1])
        # A falling reward stays out of its own baseline until it recovers (or trips).
        if self.cfg.reward_drop is not None and not self.streaks["reward_drop"]:
            self.recent = (self.recent + [float(row["reward_mean"])])[-self.cfg.window:]
        return None

    def record_rollback(self, trip: Trip, question_ids: list[str]) -> None:
        """The remedy: one more rollback, a lower learning rate, the offending questions left out."""
        self.rollbacks += 1
        self.lr_scale *= self.cfg.remedy_lr_factor
        if self.cfg.remedy_skip_questions:
            self.skipped_ids += [q for q in question_ids if q not in self.skipped_ids]

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "streaks": dict(self.streaks), "rollbacks": self.rollbacks,
                "lr_scale": self.lr_scale, "skipped_ids": list(self.skipped_ids)}

    def load_state_dict(self, state: dict, *, history_only: bool = False) -> None:
        """Restore a checkpoint's watch; `history_only` (a rollback) keeps the remedy of this run."""
        self.recent, self.streaks = list(state.get("recent", [])), dict(state.get("streaks", {}))
        if not history_only:
            self.rollbacks = int(state.get("rollbacks", 0))
            self.lr_scale = float(state.get("lr_scale", 1.0))
            self.skipped_ids = list(state.get("skipped_ids", []))


def scale_learning_rate(optimizer, scheduler, base_lr: float, scale: float) -> None:
    """Set every group's learning rate to base_lr · scale · the schedule's factor at its position
    (a LambdaLR), and the schedule's base so later steps keep the scale."""
    scheduler.base_lrs = [base_lr * scale for _ in optimizer.param_groups]
    factors = [fn(scheduler.last_epoch) for fn in scheduler.lr_lambdas]
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, factors):
        group["lr"] = base * factor
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]   # what get_last_lr() reports
