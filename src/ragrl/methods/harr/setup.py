"""HARR's policy setup: the query encoder is the policy; a frozen generator (or none) acts, and
every search it makes is a Plackett–Luce draw from the encoder's candidate pool over a dense index.

`policy: retriever` in a recipe builds this setup (registered by HARR's record). With no generator,
each question is searched `retriever.hops` times, later hops embedding HARR's history text.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from ragrl.errors import ConfigError
from ragrl.eval.harness import agent_metrics
from ragrl.eval.retrieval import retrieval_eval
from ragrl.methods.base import Setup
from ragrl.methods.harr.settings import RetrieverSettings
from ragrl.models.embedder import canonical_embedder_name, resolve_embedder
from ragrl.models.lm_weights import resolve_policy
from ragrl.models.query_encoder import QueryEncoder
from ragrl.paths import resolve_kit
from ragrl.policy.lm_model import build_policy
from ragrl.policy.model_config import engine_for
from ragrl.policy.retriever import RetrieverPolicy
from ragrl.retrieval.index import load_index
from ragrl.retrieval.resolve import cached_dense_index
from ragrl.retrieval.stochastic import StochasticRetriever, history_retriever
from ragrl.rollout.multi_turn import run_episodes
from ragrl.rollout.protocol import get_protocol
from ragrl.rollout.retrieval_only import run_retrieval_episodes

log = logging.getLogger("ragrl.train")


def retriever_setup(cfg, *, retriever=None, model_bundle=None, settings: RetrieverSettings) -> Setup:
    rc = settings
    dense = load_dense_backend(cfg)
    encoder = QueryEncoder(rc.encoder, lora=rc.lora, lora_r=rc.lora_r, lora_alpha=rc.lora_alpha)
    if encoder.dim != dense.dim:
        raise ConfigError(f"retriever.encoder {rc.encoder!r} makes {encoder.dim}-d vectors but the index "
                          f"{cfg.data.index} holds {dense.dim}-d ones")
    sampler = StochasticRetriever(dense, encoder, pool=rc.pool, temperature=rc.temperature,
                                  history=rc.history, instruction=rc.instruction, history_words=rc.history_words)
    policy = RetrieverPolicy(encoder, sampler.embeddings, rc.temperature,
                             with_value_head=cfg.algo.has_critic, with_reference=cfg.algo.kl_coef > 0)
    generator = frozen_generator(cfg) if rc.generator else None

    def rollout(samples, rcfg, group_offset):
        if generator is None:
            return run_retrieval_episodes(sampler, samples, rcfg, group_offset=group_offset, hops=rc.hops,
                                          history_branches=rc.history_branches)
        engine, protocol = generator
        return run_episodes(engine, protocol, sampler, samples, replace(rcfg, temperature=rc.generator_temperature),
                            group_offset=group_offset)

    def evaluate(samples, seed, per_question=False):
        search = sampler.searcher(rc.hops)
        out = retrieval_eval(search, samples, cfg.rollout.topk, per_question=per_question)
        out.update(k=cfg.rollout.topk * rc.hops, hops=rc.hops)   # recall over every hop's passages
        if generator is not None:   # downstream: the frozen generator searching with this encoder
            agent = agent_metrics(generator[0], sampler, cfg.agent, cfg.rollout, samples, seed, per_question)
            if per_question:
                for qid, row in agent.pop("per_question").items():
                    out["per_question"].setdefault(qid, {}).update(row)
            out.update(agent)
        return out

    def export(target: Path, state=None):
        encoder.save_encoder(target)

    def select_questions(questions, reward_fn, run_dir: Path, write: bool):
        if not rc.filter_questions:
            return questions
        return filter_questions(questions, rollout, reward_fn, cfg, run_dir, write)

    return Setup(policy, rollout, evaluate, export, artifact="encoder", shardable=False,
                 select_questions=select_questions, extras={"sampler": sampler})


def filter_questions(questions: list[dict], rollout, reward_fn, cfg, run_dir: Path, write: bool) -> list[dict]:
    """HARR's filter: keep the training questions whose reward varies across a group sampled
    from the *starting* policy (all-right or all-wrong groups teach a group estimator nothing).
    The kept ids are saved in the run dir, so a resumed run trains on the same questions."""
    path = run_dir / "kept_questions.json"
    if path.exists():
        kept = set(json.loads(path.read_text())["kept"])
    else:
        kept, chunk = set(), max(cfg.questions_per_step, 32)
        for s in range(0, len(questions), chunk):
            part = questions[s:s + chunk]
            rcfg = replace(cfg.rollout, seed=cfg.seed * 7_777_777 + s)
            trajs, _ = rollout(part, rcfg, 0)
            for t in trajs:
                t.reward = float(reward_fn(t, part[t.group]))
            for i, q in enumerate(part):
                if len({round(t.reward, 9) for t in trajs if t.group == i}) > 1:
                    kept.add(str(q["id"]))
        if write:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"kept": sorted(kept), "total": len(questions)}))
            tmp.rename(path)
    before = len(questions)
    questions = [q for q in questions if str(q["id"]) in kept]
    log.info("question filter: kept %d of %d training questions (reward varies within the group), "
             "dropped %d", len(questions), before, before - len(questions))
    if not questions:
        raise ConfigError("the question filter kept no training question: every group's reward was "
                          "flat; set retriever.filter_questions=false or use other questions")
    return questions


def eval_retriever(cfg, encoder_dir=None, dense=None) -> StochasticRetriever:
    """The run's retriever as `ragrl compare` evaluates it: the trained encoder (or, with None, the
    one it started from) over the run's dense index (`dense`, a backend already loaded, or None to load
    it), deterministic top k, its history settings."""
    encoder = QueryEncoder(str(encoder_dir) if encoder_dir is not None else cfg.retriever.encoder)
    return history_retriever(load_dense_backend(cfg) if dense is None else dense, encoder, cfg.retriever)


def load_dense_backend(cfg):
    """The dense index a retriever policy samples from (cfg.data.index, a dense or hybrid index)."""
    spec = cfg.data.index
    if not spec and cfg.data.vectors:
        spec = str(cached_dense_index(cfg.data.corpus, cfg.data.vectors, cfg.retriever.encoder))
    if not spec or "://" in str(spec):
        raise ConfigError("policy: retriever needs a local dense index: data.index (`ragrl index build --kind "
                          "dense [--vectors FILE.npy]`), or data.corpus + data.vectors")
    index = load_index(resolve_kit(spec))
    backend = index.backend.dense if index.kind == "hybrid" else index.backend
    if index.kind not in ("dense", "hybrid"):
        raise ConfigError(f"policy: retriever needs a dense or hybrid index; {cfg.data.index} is {index.kind}")
    built_with = index.manifest["encoder"]
    if canonical_embedder_name(cfg.retriever.encoder) != built_with and not Path(cfg.retriever.encoder).exists():
        raise ConfigError(f"retriever.encoder is {cfg.retriever.encoder!r} but the index {cfg.data.index} was "
                          f"built with {built_with!r}: the query side must start from the passage side's encoder")
    return backend


def frozen_generator(cfg):
    """The generator LM (no LoRA training, no value head), optionally with a trained adapter."""
    mcfg = replace(cfg.model, name=cfg.retriever.generator, lora=bool(cfg.retriever.generator_adapter),
                   init_adapter=cfg.retriever.generator_adapter)
    model, tok, _ = build_policy(mcfg)
    model.requires_grad_(False)
    model.eval()
    return engine_for(cfg.model, model, tok), get_protocol(cfg.agent)


def preflight(cfg, settings: RetrieverSettings) -> list[str]:
    """`ragrl train --check` for a retriever policy: the encoder, the dense index it samples from and
    the frozen generator, if any."""
    dense = load_dense_backend(cfg)
    lines = [f"retriever.encoder: {settings.encoder} -> {resolve_embedder(settings.encoder)}",
             f"dense index: {len(dense)} passages, {dense.dim}-d"]
    if settings.generator:
        lines.append(f"retriever.generator: {settings.generator} -> {resolve_policy(settings.generator)}")
    return lines
