"""What the trainer trains, and how it rolls out and evaluates it: one builder per policy kind.

    setup = build_setup(cfg)        # cfg.policy: "lm" | "retriever"
    trajs, stats = setup.rollout(samples, rollout_cfg, group_offset)
    setup.policy                    # a ragrl.policy.Policy: collate / forward / reference
    setup.evaluate(samples, seed)   # greedy / deterministic held-out metrics (percent, 95% CIs)
    setup.export(run_dir, state)    # the artifact a later stage or `ragrl eval` loads

`lm`: the causal LM acts and is trained; it rolls out with itself (`model.engine: hf`, no weight
sync) or with a vLLM copy that follows its weights (`vllm`).
`retriever` (HARR): the query encoder is trained; a frozen generator (or none) acts, and
every search it makes is a Plackett–Luce draw from the encoder's candidate pool.
A new kind of policy is a new builder in SETUPS, not a branch in the trainer.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ragrl.errors import ConfigError
from ragrl.paths import resolve_kit
from ragrl.policy.base import Policy
from ragrl.train.config import TrainConfig

log = logging.getLogger("ragrl.train")


@dataclass
class Setup:
    policy: Policy
    rollout: Callable          # (samples, RolloutConfig, group_offset) -> (trajectories, stats)
    evaluate: Callable         # (samples, seed, per_question) -> dict of metrics
    export: Callable           # (target_dir, gathered_state | None) -> None
    artifact: str = "adapter"  # what export writes: run_dir/final_<artifact>, best_<artifact>
    shardable: bool = True     # whether FSDP may shard policy.module
    trains: Callable = lambda traj: True   # which rolled-out trajectories the update learns from
    filter_questions: bool = False         # HARR's filter: train only on questions whose reward varies


def build_setup(cfg: TrainConfig, *, retriever=None, model_bundle=None) -> Setup:
    if cfg.policy not in SETUPS:
        raise ConfigError(f"policy must be one of {', '.join(SETUPS)}; got {cfg.policy!r}")
    return SETUPS[cfg.policy](cfg, retriever=retriever, model_bundle=model_bundle)


# ---------------------------------------------------------------- the LM acts and learns

def lm_setup(cfg: TrainConfig, *, retriever=None, model_bundle=None) -> Setup:
    from ragrl.agents.registry import get_protocol
    from ragrl.policy.lm import LMPolicy
    from ragrl.rollout.engines import make_engine
    from ragrl.rollout.runners import run_agent
    from ragrl.train.policy import build_policy

    model, tok, value_head = model_bundle or build_policy(cfg.model, with_value_head=cfg.algo.has_critic)
    protocol = get_protocol(cfg.agent)
    if cfg.agent_adapters == "per_agent":   # before the trainer collects the trainable parameters
        from ragrl.models.agent_adapters import agent_adapter_map, make_agent_adapters
        if agent_adapter_map(model) is None:
            make_agent_adapters(model, list(protocol.agents),
                                trainable={a for a in protocol.agents if a not in cfg.frozen_agents})
            log.info("one LoRA adapter per agent: %s (frozen: %s)", ", ".join(protocol.agents),
                     ", ".join(cfg.frozen_agents) or "none")
    policy = LMPolicy(model, tok, value_head, agents=protocol.agents)
    if retriever is None:
        from ragrl.train.trainer import default_retriever
        retriever = default_retriever(cfg)
    holder = {}

    def engine():
        # Built on first use: FSDP swaps weights for shards in place first, the engine keeps the module.
        if "engine" not in holder:
            holder["engine"] = make_engine(cfg.model.engine, model, tok, max_batch_size=cfg.model.max_batch_size)
        return holder["engine"]

    def rollout(samples, rcfg, group_offset):
        return run_agent(engine(), protocol, retriever, samples, rcfg, group_offset=group_offset)

    def evaluate(samples, seed, per_question=False):
        return _agent_eval(engine(), retriever, cfg, samples, seed, per_question)

    def export(final: Path, state=None):
        if hasattr(model, "peft_config"):
            tmp = final.parent / f".tmp_{final.name}"
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp, state_dict=state)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)

    s = Setup(policy, rollout, evaluate, export,
              trains=lambda t: t.agent not in cfg.frozen_agents)   # MMOA-RAG ablations freeze agents
    s.engine, s.retriever, s.tokenizer = engine, retriever, tok   # for callers that evaluate by hand
    return s


def _agent_eval(engine, retriever, cfg: TrainConfig, samples, seed, per_question) -> dict:
    from ragrl.eval.harness import EvalConfig, evaluate
    from ragrl.eval.stats import summarize

    ecfg = EvalConfig(agent=cfg.agent, systems=["agent"], n=len(samples), seed=seed, topk=cfg.rollout.topk,
                      rollout=replace(cfg.rollout, temperature=0.0, n=1))
    res = evaluate(engine, retriever, samples, ecfg)[cfg.agent]
    s = summarize(res["trajectories"], res["wall_s"], per_question=per_question)
    out = {f"{k}{suffix}": s[k][key] for k in ("em", "f1", "cover_em")
           for suffix, key in (("", "mean"), ("_lo", "ci_lo"), ("_hi", "ci_hi"))}
    out.update(searches=s["searches_per_q"], format_error_rate=s["format_error_rate"], wall_s=res["wall_s"])
    trajs = res["trajectories"]
    if trajs and all("selector_precision" in t.metrics for t in trajs):   # MMOA-RAG: keep_best: selector_f1
        from ragrl.rewards.mmoa import selector_f1
        out["selector_f1"] = 100 * sum(selector_f1(t.metrics) for t in trajs) / len(trajs)
        out["selector_kept"] = sum(len(t.metrics["selected"]) for t in trajs) / len(trajs)
    if per_question:
        out["per_question"] = s["per_question"]
    return out


# ---------------------------------------------------------------- the retriever learns (HARR)

def retriever_setup(cfg: TrainConfig, *, retriever=None, model_bundle=None) -> Setup:
    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.policy.retriever import RetrieverPolicy
    from ragrl.retrieval.stochastic import StochasticRetriever

    rc = cfg.retriever
    dense = load_dense_backend(cfg)
    encoder = QueryEncoder(rc.encoder, lora=rc.lora, lora_r=rc.lora_r, lora_alpha=rc.lora_alpha)
    if encoder.dim != dense.dim:
        raise ConfigError(f"retriever.encoder {rc.encoder!r} makes {encoder.dim}-d vectors but the index "
                          f"{cfg.data.index} holds {dense.dim}-d ones")
    sampler = StochasticRetriever(dense, encoder, pool=rc.pool, temperature=rc.temperature,
                                  history=rc.history, instruction=rc.instruction)
    policy = RetrieverPolicy(encoder, sampler.embeddings, rc.temperature,
                             with_value_head=cfg.algo.has_critic, with_reference=cfg.algo.kl_coef > 0)
    generator = _frozen_generator(cfg) if rc.generator else None

    def rollout(samples, rcfg, group_offset):
        if generator is None:
            from ragrl.rollout.retrieval_episode import run_retrieval_episodes
            return run_retrieval_episodes(sampler, samples, rcfg, group_offset=group_offset, hops=rc.hops)
        from ragrl.rollout.episode import run_episodes
        engine, protocol = generator
        return run_episodes(engine, protocol, sampler, samples, replace(rcfg, temperature=rc.generator_temperature),
                            group_offset=group_offset)

    def evaluate(samples, seed, per_question=False):
        from ragrl.eval.retrieval import retrieval_eval

        search = sampler.search if rc.hops == 1 else (lambda qs, k: sampler.search_hops(qs, k, rc.hops))
        out = retrieval_eval(search, samples, cfg.rollout.topk, per_question=per_question)
        out.update(k=cfg.rollout.topk * rc.hops, hops=rc.hops)   # recall over every hop's passages
        if generator is not None:   # downstream: the frozen generator searching with this encoder
            agent = _agent_eval(generator[0], sampler, cfg, samples, seed, per_question)
            if per_question:
                for qid, row in agent.pop("per_question").items():
                    out["per_question"].setdefault(qid, {}).update(row)
            out.update(agent)
        return out

    def export(target: Path, state=None):
        encoder.save_encoder(target)

    s = Setup(policy, rollout, evaluate, export, artifact="encoder", shardable=False,
              filter_questions=rc.filter_questions)
    s.sampler = sampler
    return s


def load_dense_backend(cfg: TrainConfig):
    """The dense index a retriever policy samples from (cfg.data.index, a dense or hybrid index)."""
    from ragrl.models.embedder import canonical_embedder_name
    from ragrl.retrieval.index import load_index

    spec = cfg.data.index
    if not spec and cfg.data.vectors:
        spec = str(cached_dense_index(cfg.data.corpus, cfg.data.vectors, cfg.retriever.encoder))
    if not spec or "://" in str(spec):
        raise ConfigError("policy: retriever needs a local dense index: data.index (`ragrl index build --kind "
                          "dense [--vectors FILE.npy]`), or data.corpus + data.vectors")
    index = load_index(resolve_kit(spec))
    backend = getattr(index.backend, "dense", index.backend)
    if not hasattr(backend, "embeddings"):
        raise ConfigError(f"policy: retriever needs a dense or hybrid index; {cfg.data.index} is {index.kind}")
    built_with = index.manifest["encoder"]
    if canonical_embedder_name(cfg.retriever.encoder) != built_with and not Path(cfg.retriever.encoder).exists():
        raise ConfigError(f"retriever.encoder is {cfg.retriever.encoder!r} but the index {cfg.data.index} was "
                          f"built with {built_with!r}: the query side must start from the passage side's encoder")
    return backend


def cached_dense_index(corpus: str | None, vectors: str, encoder: str) -> Path:
    """A dense index over precomputed vectors, built once under $RAGRL_HOME (keyed by both files)."""
    import hashlib

    from ragrl.paths import DEMO_CORPUS, ragrl_home
    from ragrl.retrieval.index import cached_index

    corpus_path, vectors_path = resolve_kit(corpus) if corpus else DEMO_CORPUS, resolve_kit(vectors)
    h = hashlib.sha256()
    for p in (corpus_path, vectors_path):
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return cached_index(corpus_path, ragrl_home() / "indexes" / f"dense-{h.hexdigest()[:16]}", "dense",
                        encoder=encoder, vectors=vectors_path, progress=False)


def _frozen_generator(cfg: TrainConfig):
    """The generator LM (no LoRA training, no value head), optionally with a trained adapter."""
    from ragrl.agents.registry import get_protocol
    from ragrl.rollout.engines import make_engine
    from ragrl.train.policy import build_policy

    mcfg = replace(cfg.model, name=cfg.retriever.generator, lora=bool(cfg.retriever.generator_adapter),
                   init_adapter=cfg.retriever.generator_adapter)
    model, tok, _ = build_policy(mcfg)
    model.requires_grad_(False)
    model.eval()
    return make_engine(cfg.model.engine, model, tok, max_batch_size=cfg.model.max_batch_size), get_protocol(cfg.agent)


SETUPS: dict[str, Callable[..., Setup]] = {"lm": lm_setup, "retriever": retriever_setup}
