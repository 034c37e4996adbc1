"""Evaluation harness: run an agent and the baselines on the same questions with the same model.

Systems:
  direct     answer with no retrieval (short-answer prompt, one line)
  naive_rag  retrieve top-k for the question once, then answer (short-answer prompt)
  agent      the multi-turn protocol (search_r1, rag_r1, r1_searcher, ...)

Every system yields Trajectories scored with the same EM / F1 / cover-EM, so the report's
numbers recompute from its JSONL. Decoding is greedy unless the config says otherwise.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ragrl.engines.base import Engine, SamplingParams
from ragrl.errors import ConfigError
from ragrl.eval.batches import in_batches
from ragrl.eval.search_gain import annotate_search_gain, records_shown_passages
from ragrl.eval.search_payoff import search_events
from ragrl.eval.stats import SEARCH_METRICS, summarize
from ragrl.retrieval.base import Retriever
from ragrl.rewards.qa import cover_em, exact_match, f1_score
from ragrl.rollout.baselines import BASELINE_ANSWER_TOKENS, baseline_answer, direct_messages, naive_rag_messages
from ragrl.rollout.config import TRAINING_ONLY, RolloutConfig
from ragrl.rollout.protocol import chat_ids, default_text_protocol, get_protocol
from ragrl.rollout.runners import answering, episodes_by_question, run_agent
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory, Turn

SYSTEMS = ("direct", "naive_rag", "agent")


@dataclass
class EvalConfig:
    agent: str = field(default_factory=default_text_protocol)   # a protocol name
    systems: list[str] = field(default_factory=lambda: ["direct", "naive_rag", "agent"])
    n: int = 200                      # questions (the first n of the file, in file order)
    batch_size: int = 32
    topk: int = 3                     # naive_rag passages (the agent uses rollout.topk)
    max_answer_tokens: int = BASELINE_ANSWER_TOKENS   # baselines' answer budget
    seed: int = 0
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(temperature=0.0))
    # The agent's runner's own settings (its method's section, at their evaluation values:
    # ragrl.methods.base.runner_settings); None: a runner that has none, or its defaults.
    runner_settings: Any = None


def score(traj: Trajectory) -> Trajectory:
    """Fill traj.metrics with em / f1 / cover_em of its answer against its golds."""
    pred = traj.answer or ""
    traj.metrics.update(
        em=exact_match(pred, traj.golds),
        f1=f1_score(pred, traj.golds),
        cover_em=cover_em(pred, traj.golds),
        gen_tokens=traj.num_action_tokens,
    )
    return traj


def run_single_turn(engine: Engine, samples: list[dict], messages: list[list[dict]],
                    cfg: EvalConfig) -> list[Trajectory]:
    """One greedy answer per question from chat `messages` (the baselines; `naive_rag` adds its searches)."""
    tok = engine.tokenizer
    prompts = [chat_ids(tok, m) for m in messages]
    params = SamplingParams(max_new_tokens=cfg.max_answer_tokens, temperature=0.0, stop=["\n"], seed=cfg.seed)
    gens = engine.generate(prompts, params)
    out = []
    for i, (s, p, g) in enumerate(zip(samples, prompts, gens)):
        g = g[0]
        text = g.text or tok.decode(g.token_ids, skip_special_tokens=False)
        ans = baseline_answer(text.replace("<|im_end|>", ""))
        out.append(Trajectory(
            sample_id=str(s.get("id", i)), question=s["question"], golds=list(s["answers"]),
            token_ids=p + g.token_ids, action_mask=[0] * len(p) + [1] * len(g.token_ids),
            logprobs=[0.0] * len(p) + list(g.logprobs), prompt_len=len(p), group=i,
            turns=[Turn(action_text=text, kind="answer")],
            answer=ans, num_searches=0, num_turns=1, stop_reason=EpisodeEnd.ANSWER,
        ))
    return out


def naive_rag(engine: Engine, search: Callable, samples: list[dict], cfg: EvalConfig, *,
              hop_size: int | None = None) -> list[Trajectory]:
    """Naive RAG, the one way it is built: `search(questions, cfg.topk)` for each question itself, each
    passage cut to its snippet of `cfg.rollout.passage_words` words, answered greedily with the naive-RAG
    prompt. A multi-hop search (a retriever run's) returns every hop's passages in hop order; `hop_size`
    splits them. Each hop is recorded as a search turn whose query is the question (a later hop adds
    what earlier ones found to the question's embedding, not to its text), then the answer turn."""
    hits = search([s["question"] for s in samples], cfg.topk)
    msgs = [naive_rag_messages(s["question"], hs, cfg.rollout.passage_words) for s, hs in zip(samples, hits)]
    trajs = run_single_turn(engine, samples, msgs, cfg)
    for s, t, hs in zip(samples, trajs, hits):
        size = hop_size or max(len(hs), 1)
        hops = [hs[i:i + size] for i in range(0, len(hs), size)]
        t.turns = [Turn(action_text="", kind="search", queries=[s["question"]], passage_ids=[[h.id for h in hop]])
                   for hop in hops] + t.turns
        t.num_searches = len(hops)
    return trajs


def run_system(system: str, engine: Engine, retriever: Retriever | None, samples: list[dict],
               cfg: EvalConfig) -> list[Trajectory]:
    """Trajectories of one system on `samples` (unscored)."""
    if system == "direct":
        return run_single_turn(engine, samples, [direct_messages(s["question"]) for s in samples], cfg)
    if system == "naive_rag":
        if retriever is None:
            raise ConfigError("naive_rag needs a retriever (an index directory or URL)")
        return naive_rag(engine, retriever.search, samples, cfg)
    if system == "agent":
        protocol = get_protocol(cfg.agent)
        # One answer a question: a training config's selector or generator branching (MMOA) is not evaluated.
        rcfg = replace(cfg.rollout, n=1, seed=cfg.seed, **TRAINING_ONLY)
        trajs, _ = run_agent(engine, protocol, retriever, samples, rcfg, settings=cfg.runner_settings)
        if protocol.answering_agent is not None:
            # A pipeline's searches are its other agents' (MMOA-RAG's rewriter): the answer carries its
            # episode's, counted as `ragrl compare` counts them, so its searches per question are not 0.
            for episode in episodes_by_question(trajs, protocol).values():
                episode[0].num_searches = len(search_events(episode))
        return answering(trajs, protocol)
    raise ConfigError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")


def evaluate(engine: Engine, retriever: Retriever | None, samples: list[dict], cfg: EvalConfig,
             *, progress: Callable[[str, int, int], None] | None = None) -> dict[str, dict]:
    """Run every system of `cfg.systems` on `samples` in batches; return per-system results.

    Returns {system: {"trajectories": [...scored...], "wall_s": float}}.
    """
    bad = [s for s in cfg.systems if s not in SYSTEMS]
    if bad:  # fail before spending minutes on the valid systems
        raise ConfigError(f"unknown systems {bad}; known: {', '.join(SYSTEMS)}")
    # Runners fall back to the position *within a batch* as sample_id; give id-less samples their
    # position in the whole set, or questions of different batches would share an id (and be
    # averaged together by the paired statistics).
    samples = [s if "id" in s else {**s, "id": str(i)} for i, s in enumerate(samples[: cfg.n])]
    results: dict[str, dict] = {}
    for system in cfg.systems:
        t0 = time.perf_counter()
        trajs: list[Trajectory] = in_batches(
            samples, cfg.batch_size, lambda batch: [score(t) for t in run_system(system, engine, retriever, batch, cfg)],
            progress=(lambda done, total: progress(system, done, total)) if progress else None)
        if system == "agent" and retriever is not None and records_shown_passages(trajs):
            annotate_search_gain(trajs, retriever)   # what its own searches found, against the question's
        name = cfg.agent if system == "agent" else system
        results[name] = {"trajectories": trajs, "wall_s": time.perf_counter() - t0}
    return results


def agent_metrics(engine: Engine, retriever: Retriever | None, agent: str, rollout: RolloutConfig,
                  samples: list[dict], seed: int, per_question: bool = False,
                  extra_metrics: Callable[[list], dict] | None = None, settings: Any = None) -> dict:
    """Greedy held-out metrics of an agent (what training's periodic evaluation logs): EM, F1 and
    cover-EM in percent with 95% CIs, searches per question, the share of questions that searched
    (retrieval_rate) and the share with format errors, and whatever `extra_metrics(trajectories)`
    adds (a method's own, e.g. MMOA-RAG's selector F1). `settings`: its runner's own
    (EvalConfig.runner_settings)."""
    ecfg = EvalConfig(agent=agent, systems=["agent"], n=len(samples), seed=seed, topk=rollout.topk,
                      rollout=replace(rollout, temperature=0.0, n=1), runner_settings=settings)
    res = evaluate(engine, retriever, samples, ecfg)[agent]
    s = summarize(res["trajectories"], res["wall_s"], per_question=per_question)
    out = {f"{k}{suffix}": s[k][key] for k in ("em", "f1", "cover_em")
           for suffix, key in (("", "mean"), ("_lo", "ci_lo"), ("_hi", "ci_hi"))}
    out.update(searches=s["searches_per_q"], retrieval_rate=s["retrieval_rate"],
               format_error_rate=s["format_error_rate"], wall_s=res["wall_s"])
    for key in SEARCH_METRICS:   # where evaluate() measured them (eval/search_gain.py)
        if key in s:
            out.update({key: s[key]["mean"], f"{key}_lo": s[key]["ci_lo"], f"{key}_hi": s[key]["ci_hi"]})
    if extra_metrics is not None and res["trajectories"]:
        out.update(extra_metrics(res["trajectories"]))
    if per_question:
        out["per_question"] = s["per_question"]
    return out
