"""The core's policy setup, `policy: lm`: the causal LM acts and is trained. It rolls out with
itself (`model.engine: hf`, no weight sync) or with a vLLM copy that follows its weights (`vllm`).
Registered in POLICY_SETUPS like a method's own setup (HARR's `retriever`)."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ragrl.eval.harness import agent_metrics
from ragrl.methods.base import POLICY_SETUPS, Setup, method_for, runner_settings
from ragrl.models.agent_adapters import agent_adapter_map, make_agent_adapters
from ragrl.policy.lm import LMPolicy
from ragrl.policy.lm_model import build_policy
from ragrl.policy.model_config import engine_for
from ragrl.retrieval.resolve import retriever_for
from ragrl.rollout.protocol import get_protocol
from ragrl.rollout.runners import run_agent

log = logging.getLogger("ragrl.train")


def lm_setup(cfg, *, retriever=None, model_bundle=None, settings=None) -> Setup:
    """The LM that acts is the policy; `retriever` is what its searches call (None: the run's index or
    URL, a BM25 index over data.corpus otherwise). `settings` is None: the core's setup has no section."""
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
        retriever = retriever_for(cfg.data.index, cfg.data.corpus, wait_s=cfg.guard.retrieval_wait_s)
    method = method_for(cfg.agent, cfg.policy)
    extra_metrics = method.eval_metrics if method is not None else None
    holder = {}

    def engine():
        # Built on first use: FSDP swaps weights for shards in place first, the engine keeps the module.
        if "engine" not in holder:
            holder["engine"] = engine_for(cfg.model, model, tok, switches_adapters=cfg.rollout.answer_by != "policy")
        return holder["engine"]

    # the runner's method's own section (MMOA-RAG's), if any: as trained, and as evaluation runs it
    own, own_eval = runner_settings(cfg, protocol.runner), runner_settings(cfg, protocol.runner, evaluation=True)

    def rollout(samples, rcfg, group_offset):
        return run_agent(engine(), protocol, retriever, samples, rcfg, group_offset=group_offset, settings=own)

    def evaluate(samples, seed, per_question=False):
        return agent_metrics(engine(), retriever, cfg.agent, cfg.rollout, samples, seed, per_question,
                             extra_metrics=extra_metrics, settings=own_eval)

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


POLICY_SETUPS.register("lm", lm_setup)
