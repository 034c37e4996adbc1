"""The MMOA-RAG pipeline runner: rewriter → retrieve → selector → generator, per question.

Same engine, retriever and Trajectory type as the multi-turn runner. Each of the `cfg.n`
pipelines of a question yields three trajectories, one per agent (`traj.agent`), each its own
(prompt, response) sample: prompt tokens masked, the agent's generated tokens its actions. All
three carry the pipeline's final answer (`traj.answer`), so the shared answer F1 scores each of
them the same, and `metrics["penalized"]` flags that agent's own penalty (ragrl.methods.mmoa.protocol).
The selector decodes under a grammar (`SamplingParams.allowed_tokens`): only `Document<d>` ids,
commas and end of sequence. Where the model has one LoRA adapter per agent, each agent generates
with its own (ragrl.models.agent_adapters); otherwise all share one.

With `settings.selector_samples` = K > 1 a pipeline branches at the selector: its rewriter output and
candidates are kept, the selector samples K selections of them and the generator answers each, so
a pipeline yields one rewriter trajectory (scored by its first branch's answer) and K selector and
generator trajectories. The K selector samples of one pipeline share a group of their own: a group
baseline (gae_baseline, grpo) then compares selections of the *same* candidates, which says which
documents helped, where a group over pipelines mixes in how lucky the rewriter's retrieval was.

With `settings.generator_samples` = G > 1 each selection branches again at the generator: G answers to
one prompt (the same kept documents), one group of their own, so a group baseline compares answers
to the same context: which answer, not which documents. The rewriter and selector trajectories are
scored by their first branch's answer, as above.

Wall-time bounds (rollout.max_episode_s / max_rollout_s): every pipeline starts with the call, so
each has the deadline `episode_deadline` gives; every agent's SamplingParams carry it, and a
pipeline whose agent is cut there ("timeout") or that is past it when an agent's turn comes (a
slow retrieval) ends: no retrieval or later agent runs for it (their trajectories hold only their
prompt), the cut output is not parsed, it has no answer, and every one of its trajectories ends
with stop_reason "timeout" (they share the pipeline's fate and answer).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ragrl.engines.base import Engine, Generation, SamplingParams
from ragrl.methods.mmoa.settings import MMOASettings, check_settings
from ragrl.methods.mmoa.protocol import (
    AGENTS,
    MMOAProtocol,
    generator_penalized,
    parse_selection,
    parse_subquestions,
    selector_f1,
    selector_grammar,
    split_budget,
)
from ragrl.models.agent_adapters import activate_agent
from ragrl.retrieval.base import Hit, Retriever
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import episode_deadline
from ragrl.rollout.protocol import chat_ids
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory, Turn


@dataclass
class MMOABudgets:
    rewriter_tokens: int = 64
    selector_tokens: int = 24
    generator_tokens: int = 32
    total_candidates: int = 10


@dataclass
class _Pipe:
    sample: dict
    index: int                 # the question's position in `samples`
    pipeline: int = 0          # which of its cfg.n pipelines
    selection: int = 0         # which of the pipeline's settings.selector_samples selections
    subqs: list[str] = field(default_factory=list)
    docs: list[Hit] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    answer: str | None = ""
    penalized: dict = field(default_factory=dict)
    trajs: dict = field(default_factory=dict)
    deadline: float | None = None   # time.monotonic() instant the pipeline must end by
    timed_out: bool = False         # cut at or past `deadline`: nothing more runs for it
    found: dict[int, list[Hit]] = field(default_factory=dict)   # sub-question j -> what its search returned


def run_mmoa_episodes(engine: Engine, protocol: MMOAProtocol, retriever: Retriever | None, samples: list[dict],
                      cfg: RolloutConfig, *, group_offset: int = 0,
                      budgets: MMOABudgets | None = None,
                      settings: MMOASettings | None = None) -> tuple[list[Trajectory], dict[str, float]]:
    """(1 + K x (1 + G)) x cfg.n trajectories per sample (K = settings.selector_samples, G =
    settings.generator_samples; `settings`: the recipe's `mmoa:` section, None its defaults):
    sample-major, then pipeline, then branch (its rewriter's trajectory first, each selection's
    selector trajectory before its answers), then agent order."""
    start = time.monotonic()   # at entry: every pipeline starts with the rollout
    deadline = episode_deadline(cfg, start, episode_start=start)
    b = budgets or MMOABudgets()
    own = settings or MMOASettings()
    check_settings(own)
    tok = engine.tokenizer
    pipes = [_Pipe(s, i, j, deadline=deadline) for i, s in enumerate(samples) for j in range(cfg.n)]
    stats = {"generate_s": 0.0, "retrieval_s": 0.0, "gen_tokens": 0, "timeouts": 0}

    def group(pipe: _Pipe, agent: str) -> int:
        if agent == "selector" and own.selector_samples > 1:
            # One group per pipeline; negative, so it never meets a (question, agent) id.
            return -1 - ((group_offset + pipe.index) * cfg.n + pipe.pipeline)
        if agent == "generator" and own.generator_samples > 1:
            # One group per selection, in a range of its own below the selector's.
            return -(1 << 40) - (((group_offset + pipe.index) * cfg.n + pipe.pipeline) * own.selector_samples
                                 + pipe.selection)
        return (group_offset + pipe.index) * len(AGENTS) + AGENTS.index(agent)

    def generate(agent: str, messages: list[list[dict]], max_tokens: int, allowed=None) -> None:
        prompts = [chat_ids(tok, m) for m in messages]
        if deadline is not None:   # past it before this agent's turn (a slow retrieval): not run
            now = time.monotonic()
            for pipe in pipes:
                pipe.timed_out = pipe.timed_out or now >= pipe.deadline
        live = [k for k, pipe in enumerate(pipes) if not pipe.timed_out]
        temperature = 0.0 if agent in own.greedy_agents else cfg.temperature
        params = [SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=cfg.top_p,
                                 seed=None if cfg.seed is None else cfg.seed * 7 + AGENTS.index(agent),
                                 allowed_tokens=allowed[k] if allowed else None, deadline=pipes[k].deadline)
                  for k in live]
        t0 = time.perf_counter()
        activate_agent(getattr(engine, "model", None), agent)   # per-agent LoRA: this agent's
        gens = dict(zip(live, engine.generate([prompts[k] for k in live], params))) if live else {}
        stats["generate_s"] += time.perf_counter() - t0
        for k, (pipe, p) in enumerate(zip(pipes, prompts)):
            # A pipeline that timed out earlier gets its prompt only: no action, and no parse below.
            g = gens[k][0] if k in gens else Generation([], [], "timeout")
            pipe.timed_out = pipe.timed_out or g.stop_reason == "timeout"
            stats["gen_tokens"] += len(g.token_ids)
            text = g.text if g.text else tok.decode(g.token_ids[:-1] if g.stop_reason == "eos" else g.token_ids)
            pipe.trajs[agent] = Trajectory(
                sample_id=str(pipe.sample.get("id", pipe.index)), question=pipe.sample["question"],
                golds=list(pipe.sample.get("answers", [])), token_ids=p + list(g.token_ids),
                action_mask=[0] * len(p) + [1] * len(g.token_ids), logprobs=[0.0] * len(p) + list(g.logprobs),
                prompt_len=len(p), group=group(pipe, agent),
                agent=agent, turns=[Turn(action_text=text, kind=agent)], num_turns=1, stop_reason=EpisodeEnd(g.stop_reason),
                metrics={"protocol": protocol.name})

    # 1. rewriter
    generate("rewriter", [protocol.rewriter_messages(p.sample["question"]) for p in pipes], b.rewriter_tokens)
    now = time.monotonic()
    for p in pipes:
        # A cut rewrite is no rewrite; past the deadline already, the retrieval would be wasted.
        p.timed_out = p.timed_out or (p.deadline is not None and now >= p.deadline)
        if p.timed_out:   # no sub-questions, no retrieval, no penalty
            p.penalized["rewriter"] = False
            continue
        p.subqs, p.penalized["rewriter"] = parse_subquestions(p.trajs["rewriter"].turns[0].action_text,
                                                              p.sample["question"])
    # 2. retrieval: the sub-questions share a budget of candidates; one call per distinct k
    t0 = time.perf_counter()
    wanted: dict[int, list[tuple[_Pipe, int, str]]] = {}
    for p in pipes:
        if p.timed_out:
            continue
        for j, (q, k) in enumerate(zip(p.subqs, split_budget(len(p.subqs), b.total_candidates))):
            wanted.setdefault(k, []).append((p, j, q))
    found: dict[tuple[int, int], list[Hit]] = {}
    for k, items in wanted.items():
        hits = retriever.search([q for _, _, q in items], k) if retriever is not None else [[] for _ in items]
        for (p, j, _), hs in zip(items, hits):
            found[(id(p), j)] = hs
    for p in pipes:
        seen = set()
        p.found = {j: found[(id(p), j)] for j in range(len(p.subqs))}
        for j in range(len(p.subqs)):
            for h in found[(id(p), j)]:
                if h.id not in seen:
                    seen.add(h.id)
                    p.docs.append(h)
        p.docs = p.docs[: b.total_candidates]
    stats["retrieval_s"] += time.perf_counter() - t0
    # 3a. branch: K copies of each pipeline share its sub-questions and candidates (not its rewriter trajectory)
    pipes = [p if k == 0 else _Pipe(p.sample, p.index, p.pipeline, k, p.subqs, p.docs,
                                    penalized={"rewriter": p.penalized["rewriter"]},
                                    deadline=p.deadline, timed_out=p.timed_out)
             for p in pipes for k in range(own.selector_samples)]
    # 3. selector, constrained to id lists over this pipeline's documents
    generate("selector", [protocol.selector_messages(p.sample["question"], p.docs) for p in pipes],
             b.selector_tokens, allowed=[selector_grammar(tok, max(1, len(p.docs))) for p in pipes])
    for p in pipes:
        p.kept, p.penalized["selector"] = parse_selection(p.trajs["selector"].turns[0].action_text, len(p.docs))
        if not p.docs or p.timed_out:
            p.kept, p.penalized["selector"] = [], False
    # 3b. branch: G copies of each selection share its kept documents (not its selector trajectory)
    pipes = [p if g == 0 else _Pipe(p.sample, p.index, p.pipeline, p.selection, p.subqs, p.docs, list(p.kept),
                                    penalized={a: p.penalized[a] for a in ("rewriter", "selector")},
                                    deadline=p.deadline, timed_out=p.timed_out)
             for p in pipes for g in range(own.generator_samples)]
    # 4. generator
    generate("generator", [protocol.generator_messages(p.sample["question"], [p.docs[i] for i in p.kept])
                           for p in pipes], b.generator_tokens)
    out = []
    for p in pipes:
        if p.timed_out:   # no answer from a cut (or unrun) generator
            p.answer, p.penalized["generator"] = None, False
        else:
            p.answer = protocol.extract_answer(p.trajs["generator"].turns[0].action_text) or ""
            p.penalized["generator"] = generator_penalized(p.answer)
        gold = set(p.sample.get("gold_passage_ids") or [])
        kept_ids = [p.docs[i].id for i in p.kept]
        for agent in AGENTS:
            if agent not in p.trajs:      # a branch after the first has no rewriter trajectory
                continue
            t = p.trajs[agent]
            t.answer = p.answer
            if p.timed_out:
                t.stop_reason = EpisodeEnd.TIMEOUT
            t.metrics.update(penalized=bool(p.penalized[agent]), subquestions=list(p.subqs),
                             retrieved=[h.id for h in p.docs], selected=kept_ids)
            if gold:
                t.metrics["selector_precision"] = len(gold & set(kept_ids)) / len(kept_ids) if kept_ids else 0.0
                t.metrics["selector_recall"] = len(gold & set(kept_ids)) / len(gold)
        if "rewriter" in p.trajs:
            p.trajs["rewriter"].turns[0].queries = list(p.subqs)
            p.trajs["rewriter"].num_searches = len(p.subqs)
            # one list per sub-question (what its search returned), as a search agent's turns record them
            p.trajs["rewriter"].turns[0].passage_ids = [[h.id for h in p.found.get(j, [])] for j in range(len(p.subqs))]
            # and their texts, as the multi-turn runner keeps them: what a reward on the searches reads
            p.trajs["rewriter"].turns[0].passage_texts = [[h.full_text for h in p.found.get(j, [])]
                                                          for j in range(len(p.subqs))]
            # Logged by the trainer as one mean a step (`rollout/<name>`): a selector that learns to
            # keep a single document, or a rewriter that never splits, shows in the curves.
            p.trajs["rewriter"].metrics["scalars"] = {"rewriter_subquestions": float(len(p.subqs))}
        kept_texts = [p.docs[i].full_text for i in p.kept]
        p.trajs["generator"].turns[0].passage_ids = [kept_ids]   # what the answer was read from
        p.trajs["generator"].turns[0].passage_texts = [kept_texts]
        if "selector" in p.trajs:         # an answer branch after the first has no selector trajectory
            p.trajs["selector"].turns[0].passage_ids = [kept_ids]
            p.trajs["selector"].turns[0].passage_texts = [kept_texts]
            sel = p.trajs["selector"].metrics
            sel["scalars"] = {"selector_kept": float(len(kept_ids))}
            if gold:
                sel["scalars"]["selector_f1"] = selector_f1(sel)
        out += [p.trajs[a] for a in AGENTS if a in p.trajs]
    stats["timeouts"] = sum(t.stop_reason == EpisodeEnd.TIMEOUT for t in out)
    return out, stats
