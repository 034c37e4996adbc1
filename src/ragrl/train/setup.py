"""What the trainer trains, and how it rolls out and evaluates it: one builder per policy kind.

    setup = build_setup(cfg)        # cfg.policy: "lm", or a kind a method adds ("retriever": HARR)
    trajs, stats = setup.rollout(samples, rollout_cfg, group_offset)
    setup.policy                    # a ragrl.policy.Policy: collate / forward / reference
    setup.evaluate(samples, seed)   # greedy / deterministic held-out metrics (percent, 95% CIs)
    setup.export(run_dir, state)    # the artifact a later stage or `ragrl eval` loads

`lm` (the core's): the causal LM acts and is trained; it rolls out with itself (`model.engine: hf`,
no weight sync) or with a vLLM copy that follows its weights (`vllm`). A new kind of policy is a
setup in a method's record (`Method.setups`), not a branch in the trainer.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ragrl.errors import ConfigError
from ragrl.eval.harness import agent_metrics
from ragrl.methods.base import METHODS, Setup, method_for, runner_settings, settings_of, setups
from ragrl.models.agent_adapters import agent_adapter_map, make_agent_adapters
from ragrl.policy.lm import LMPolicy
from ragrl.policy.lm_model import build_policy
from ragrl.policy.model_config import engine_for
from ragrl.retrieval.resolve import retriever_for
from ragrl.rollout.protocol import get_protocol
from ragrl.rollout.runners import run_agent
from ragrl.train.config import TrainConfig

log = logging.getLogger("ragrl.train")


def all_setups() -> dict:
    """Policy kinds by name: the core's `lm` and every method's."""
    return {"lm": lm_setup, **setups()}


def build_setup(cfg: TrainConfig, *, retriever=None, model_bundle=None) -> Setup:
    known = all_setups()
    if cfg.policy not in known:
        raise ConfigError(f"policy must be one of {', '.join(known)}; got {cfg.policy!r}")
    if cfg.policy == "lm":
        return lm_setup(cfg, retriever=retriever, model_bundle=model_bundle)
    owner = next(m for m in METHODS.values() if cfg.policy in m.setups)
    return known[cfg.policy](cfg, retriever=retriever, model_bundle=model_bundle, settings=settings_of(cfg, owner))


def default_retriever(cfg: TrainConfig):
    """The configured index/URL, or a BM25 index over the (demo) corpus cached in $RAGRL_HOME.
    A retrieval server (URL) that stops answering is waited for up to guard.retrieval_wait_s."""
    return retriever_for(cfg.data.index, cfg.data.corpus, wait_s=cfg.guard.retrieval_wait_s)


def lm_setup(cfg: TrainConfig, *, retriever=None, model_bundle=None) -> Setup:
    model, tok, value_head = model_bundle or build_policy(cfg.model, with_value_head=cfg.algo.has_critic)
    protocol = get_protocol(cfg.agent)
    if cfg.agent_adapters == "per_agent":   # before the trainer collects the trainable parameters
        if agent_adapter_map(model) is None:
            make_agent_adapters(model, list(protocol.agents),
                                trainable={a for a in protocol.agents if a not in cfg.frozen_agents})
            log.info("one LoRA adapter per agent: %s (frozen: %s)", ", ".join(protocol.agents),
                     ", ".join(cfg.frozen_agents) or "none")
    policy = LMPolicy(model, tok, value_head, agents=protocol.agents)
    if retriever is None:
        retriever = default_retriever(cfg)
    method = method_for(cfg.agent, cfg.policy)
    extra_metrics = method.eval_metrics if method is not None else None
    holder = {}

    def engine():
        # Built on first use: FSDP swaps weights for shards in place first, the engine keeps the module.
        if "engine" not in holder:
            holder["engine"] = engine_for(cfg.model, model, tok)
        return holder["engine"]

    settings = runner_settings(cfg, protocol.runner)   # the runner's method's own section, if it has one

    def rollout(samples, rcfg, group_offset):
        return run_agent(engine(), protocol, retriever, samples, rcfg, group_offset=group_offset, settings=settings)

    def evaluate(samples, seed, per_question=False):
        return agent_metrics(engine(), retriever, cfg.agent, cfg.rollout, samples, seed, per_question,
                             extra_metrics=extra_metrics, settings=runner_settings(cfg, protocol.runner, evaluation=True))

    def export(final: Path, state=None):
        if hasattr(model, "peft_config"):   # a LoRA (peft) model saves its adapter; a full model has none
            tmp = final.parent / f".tmp_{final.name}"
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp, state_dict=state)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)

    return Setup(policy, rollout, evaluate, export,
                 trains=lambda t: t.agent not in cfg.frozen_agents,   # MMOA-RAG ablations freeze agents
                 extras={"engine": engine, "retriever": retriever, "tokenizer": tok})
