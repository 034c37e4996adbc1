"""What the trainer trains, and how it rolls out and evaluates it: one builder per policy kind.

    setup = build_setup(cfg)        # cfg.policy: "lm", or a kind a method adds ("retriever": HARR)
    trajs, stats = setup.rollout(samples, rollout_cfg, group_offset)
    setup.policy                    # a ragrl.policy.Policy: collate / forward / reference
    setup.evaluate(samples, seed)   # greedy / deterministic held-out metrics (percent, 95% CIs)
    setup.export(run_dir, state)    # the artifact a later stage or `ragrl eval` loads

`lm` (the core's, ragrl.methods.lm_setup): the causal LM acts and is trained. A new kind of policy
is a setup in a method's record (`Method.setups`), not a branch in the trainer: both are looked up
in one registry, `POLICY_SETUPS`.
"""
from __future__ import annotations

from ragrl.methods.base import METHODS, POLICY_SETUPS, Setup, settings_of
from ragrl.retrieval.resolve import retriever_for
from ragrl.train.config import TrainConfig


def build_setup(cfg: TrainConfig, *, retriever=None, model_bundle=None) -> Setup:
    """The setup `cfg.policy` names (POLICY_SETUPS: the core's `lm`, a method's own), given the
    section of the method that adds it (None for the core's)."""
    build = POLICY_SETUPS[cfg.policy]
    owner = next((m for m in METHODS.values() if cfg.policy in m.setups), None)
    return build(cfg, retriever=retriever, model_bundle=model_bundle, settings=settings_of(cfg, owner))


def default_retriever(cfg: TrainConfig):
    """The configured index/URL, or a BM25 index over the (demo) corpus cached in $RAGRL_HOME.
    A retrieval server (URL) that stops answering is waited for up to guard.retrieval_wait_s."""
    return retriever_for(cfg.data.index, cfg.data.corpus, wait_s=cfg.guard.retrieval_wait_s)
