"""Episodes written as a protocol *would* produce them, for SFT warm starts.

A 135M model ignores tag protocols out of the box, so RL would see no valid episode to
reinforce. These builders write episodes in the protocol's own tags: search with the question,
read real retrieval results (the gold passage put in if the retriever missed it), search for
the next gold title, then answer. They are built with the same token-level layout as rollouts
(prompt and observations masked), so SFT learns only the policy's own tokens.
"""
from __future__ import annotations

import logging
import random
from dataclasses import replace

from ragrl.datasets import load_questions
from ragrl.errors import ConfigError
from ragrl.methods.base import SFT_BUILDERS
from ragrl.retrieval.base import Hit, Retriever
from ragrl.retrieval.corpus import load_corpus
from ragrl.retrieval.resolve import corpus_of
from ragrl.rewards.qa import normalize_answer
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import prompt_ids
from ragrl.rollout.observations import build_observation
from ragrl.rollout.protocol import NEXT_SEARCH_THOUGHT, SEARCH_THOUGHT, TextProtocol, get_protocol
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory, Turn

log = logging.getLogger("ragrl.train")
# How a gold episode chooses its further searches (see synth_trajectory).
NEXT_QUERIES = ("every_gold", "missed_gold")



def render_answer(p: TextProtocol, answer: str, thought: str | None, first: bool = False) -> str:
    """The answer action; thought=None writes no think block where the protocol allows that."""
    return f"{p.answer_opening(thought, first)} {answer} {p.answer[1]}"


def _with_gold(hits: list[Hit], golds: list[Hit], k: int) -> list[Hit]:
    """The retriever's top-k with every `golds` passage in it (replacing the lowest non-gold hits)."""
    hits = list(hits[:k])
    # Only the golds that fit are protected: with more golds than k (MuSiQue has up to 4), a
    # retrieved gold beyond the first k may give way to one of the first k.
    gold_ids = {g.id for g in golds[:k]}
    for g in golds[:k]:
        if all(h.id != g.id for h in hits):
            if len(hits) < k:
                hits.append(g)
                continue
            worst = max(i for i, h in enumerate(hits) if h.id not in gold_ids)
            hits[worst] = g
    return hits


def synth_trajectory(tok, protocol: TextProtocol, sample: dict, retriever: Retriever, passages: dict[str, Hit],
                     cfg: RolloutConfig, rng: random.Random, insert_gold: bool = True,
                     runner_first: str = "free", next_query: str = "every_gold",
                     runner_second: bool = False, end_after_searches: int | None = None) -> Trajectory:
    """One gold episode: search the question, then further gold titles, then answer.

    next_query="every_gold" searches each further gold title in turn; "missed_gold" searches only a
    gold title that the searches so far have not shown and that the episode can read (in its question
    or its observations), and answers once there is none (one query a search). insert_gold=False keeps
    the index's own results (an expert episode in an RL group is scored on what its queries found);
    runner_first writes the first search as the runner does under that `rollout.first_action`: its
    opening (search) or all of it (question) as the runner's tokens, out of the loss; under question
    its results are the index's own, nothing put in, as the runner serves them. runner_second writes
    the second search's opening as `rollout.second_action: search` does (the runner's, out of the loss).
    end_after_searches ends the episode on the passages of that search, as the runner does under
    `rollout.end_after_searches`: no observation tokens after it and no answer (stop reason RETRIEVED);
    that turn's `observation` still holds what it would have shown, for `answer_visible`."""
    if next_query not in NEXT_QUERIES:
        raise ConfigError(f"next_query must be one of {NEXT_QUERIES}, got {next_query!r}")
    golds = [passages[i] for i in sample.get("gold_passage_ids", []) if i in passages]
    rng.shuffle(golds)
    # Search first for the passage the question names (the bridge); its title is usually in it.
    golds.sort(key=lambda h: h.title.lower() not in sample["question"].lower())
    # One search per turn that the budget leaves before the answer turn; with a single search
    # every gold passage goes into its results, so the episode still holds the evidence.
    n_search = max(1, cfg.max_turns - 1)
    multi = protocol.max_queries > 1
    if next_query == "every_gold":
        queries = [sample["question"]] + [g.title for g in golds[1:n_search]]
        plan = [queries] if multi else [[q] for q in queries]
        gold_plan = [golds] if len(plan) == 1 else [[g] for g in golds]
    elif multi:
        raise ConfigError(f"next_query='missed_gold' writes one query a search; {protocol.name} writes "
                          f"{protocol.max_queries} (use next_query='every_gold')")
    else:   # further searches are chosen as the episode goes, from what it has read
        plan, gold_plan = [[sample["question"]]], [golds if n_search == 1 else golds[:1]]
    t = _start(tok, protocol, sample)
    thoughts = [SEARCH_THOUGHT, NEXT_SEARCH_THOUGHT]
    for turn_i, qs in enumerate(plan):   # a missed_gold plan grows inside the loop
        action = protocol.search_action(qs, thoughts[min(turn_i, 1)], first=turn_i == 0)
        served = turn_i == 0 and runner_first == "question"   # the runner's own search of the question
        opened = (turn_i == 0 and runner_first == "search") or (turn_i == 1 and runner_second)
        hits = retriever.search(qs, cfg.topk)
        put_in = insert_gold and not served   # the runner serves what the index returns
        if put_in and multi:
            hits = [_with_gold(hs, [g] if j < len(golds) and (g := golds[j]) else [], cfg.topk)
                    for j, hs in enumerate(hits)]
        elif put_in:
            hits = [_with_gold(hits[0], gold_plan[turn_i] if turn_i < len(gold_plan) else [], cfg.topk)]
        obs, obs_ids = build_observation(tok, protocol, qs, hits, cfg)
        ends = end_after_searches is not None and t.num_searches + 1 >= end_after_searches
        if ends:   # the runner builds no observation after the last search: its passages are on the turn
            obs_ids = []
        if served:
            _append(t, tok, action, obs_ids, masked=True)
        elif opened:   # the runner wrote the opening (first_action / second_action: search), the policy the rest
            opening = protocol.search_opening(thoughts[min(turn_i, 1)], first=turn_i == 0)
            _append(t, tok, opening, [], masked=True)
            if turn_i == 0:
                t.prompt_len = len(t.token_ids)   # as the runner counts it: the opening is the prompt's
            _append(t, tok, action[len(opening):], obs_ids)
        else:
            _append(t, tok, action, obs_ids)
        t.turns.append(Turn(action_text=action, kind="search", queries=qs,
                            passage_ids=[[h.id for h in hs] for hs in hits],
                            passage_titles=[[h.title for h in hs] for hs in hits],
                            passage_texts=[[h.full_text for h in hs] for hs in hits], observation=obs,
                            by_runner=served))
        t.num_searches += 1
        if ends:
            t.num_turns, t.stop_reason = len(t.turns), EpisodeEnd.RETRIEVED
            return t
        if next_query == "missed_gold" and len(plan) < n_search and (g := _missed_readable(t, golds)):
            plan.append([g.title])
            gold_plan.append([g])
    # No thought between the documents and the answer: a fixed sentence there ("The documents
    # give the answer.") became the answer itself in a third of a warm-started policy's episodes
    # (measured on the train-only dev split), and such episodes score 0, so RL learnt to stop
    # searching. The answer now follows the documents directly, which the protocol allows.
    return _finish(t, tok, protocol, sample["answers"][0], None)


def _missed_readable(t: Trajectory, golds: list[Hit]) -> Hit | None:
    """The first gold passage that the episode's searches have not shown and whose title its question
    or observations hold: a query the policy can copy from what it read, not guess. Searching again
    for a title already shown teaches repeating a search; one the episode never saw teaches guessing
    (the two made up 85% of `every_gold`'s second queries on pool-train)."""
    shown = {pid for turn in t.turns for ids in turn.passage_ids for pid in ids}
    read = f" {normalize_answer(' '.join([t.question] + [turn.observation for turn in t.turns]))} "
    return next((g for g in golds if g.id not in shown and f" {normalize_answer(g.title)} " in read), None)


def expert_trajectory(tok, protocol: TextProtocol, sample: dict, retriever: Retriever, passages: dict[str, Hit],
                      cfg: RolloutConfig, rng: random.Random, next_query: str = "every_gold") -> Trajectory | None:
    """An expert episode for an RL group (DAVID-GRPO's expert bootstrapping): the gold episode's
    queries (the question, then the further gold titles; `next_query` as in synth_trajectory) with the
    index's own results, nothing put in, so the group's reward scores what those queries really find.
    It has the runner's shape under `cfg`: the first search as `first_action` writes it, the second's
    opening as `second_action: search` writes it (both masked), and under `end_after_searches` it ends
    on that search's passages, with no answer, as the runner's episodes do. None where its searches
    show no gold answer (an expert that answers what it was not shown would teach guessing), and under
    `second_action: search` where it has no second query (the runner opens a second search in every
    episode)."""
    t = synth_trajectory(tok, protocol, sample, retriever, passages, cfg, rng, insert_gold=False,
                         runner_first=cfg.first_action, next_query=next_query,
                         runner_second=cfg.second_action == "search", end_after_searches=cfg.end_after_searches)
    if not answer_visible(t) or (cfg.second_action == "search" and t.num_searches < 2):
        return None
    if t.stop_reason == EpisodeEnd.RETRIEVED:
        t.turns[-1].observation = ""   # what the runner's turn holds: no observation was built
    return t


def direct_trajectory(tok, protocol: TextProtocol, sample: dict) -> Trajectory:
    """An episode that answers at once, with no search (the other action the policy can take)."""
    t = _start(tok, protocol, sample)
    return _finish(t, tok, protocol, sample["answers"][0], "I can answer this without searching.")


def _start(tok, protocol: TextProtocol, sample: dict) -> Trajectory:
    """A trajectory holding only the prompt (masked out of the loss)."""
    p_ids = prompt_ids(tok, protocol, sample["question"])
    return Trajectory(sample_id=str(sample["id"]), question=sample["question"], golds=list(sample["answers"]),
                      token_ids=list(p_ids), action_mask=[0] * len(p_ids), logprobs=[0.0] * len(p_ids),
                      prompt_len=len(p_ids))


def _finish(t: Trajectory, tok, protocol: TextProtocol, answer: str, thought: str | None) -> Trajectory:
    """Append the answer turn; with no search before it, it opens its own thought block."""
    action = render_answer(protocol, answer, thought, first=not t.turns)
    _append(t, tok, action, [])
    t.turns.append(Turn(action_text=action, kind="answer"))
    t.answer, t.num_turns, t.stop_reason = answer, len(t.turns), EpisodeEnd.ANSWER
    return t


def _append(t: Trajectory, tok, action: str, obs_ids: list[int], masked: bool = False) -> None:
    a = tok.encode(action, add_special_tokens=False)
    t.token_ids += a + obs_ids
    t.action_mask += [0 if masked else 1] * len(a) + [0] * len(obs_ids)
    t.logprobs += [0.0] * (len(a) + len(obs_ids))


def answer_visible(traj: Trajectory) -> bool:
    """Whether a gold answer (normalised) occurs in the episode's observations (yes/no always do)."""
    seen = normalize_answer(" ".join(t.observation for t in traj.turns))
    golds = [normalize_answer(g) for g in traj.golds]
    return any(g in ("yes", "no") or (g and f" {g} " in f" {seen} ") for g in golds)


def corpus_passages(index: str | None, corpus: str | None) -> dict[str, Hit]:
    """Every passage of the run's corpus by id (the gold passages' titles are read from it)."""
    c = load_corpus(corpus_of(index, corpus))
    return {c.ids[i]: Hit(c.ids[i], c.titles[i], c.texts[i], 0.0) for i in range(len(c))}


def gold_samples(cfg) -> list[dict]:
    """The training questions a gold episode can be written for (those with gold_passage_ids)."""
    samples = [s for s in load_questions(cfg.data.train) if s.get("gold_passage_ids")]
    if not samples:
        raise ConfigError(f"SFT needs training questions with gold_passage_ids; {cfg.data.train} has none "
                          "(add them, or --set sft.steps=0 to start RL from the base model)")
    return samples


def warm_start_episodes(cfg, tok, retriever, next_query: str = "every_gold") -> list:
    """The `gold_search` SFT episodes: gold search episodes whose answer the observations show, plus
    `sft.direct_frac` of episodes that answer at once (questions drawn at random). next_query: see
    `synth_trajectory` (`gold_search_missed` builds with "missed_gold")."""
    frac = cfg.sft.direct_frac
    if not 0.0 <= frac < 1.0:
        raise ConfigError(f"sft.direct_frac must be in [0, 1), got {frac!r}")
    passages = corpus_passages(cfg.data.index, cfg.data.corpus)
    protocol = get_protocol(cfg.agent)
    rng = random.Random(cfg.seed)
    samples = gold_samples(cfg)
    trajs = [synth_trajectory(tok, protocol, s, retriever, passages, cfg.rollout, rng, next_query=next_query)
             for s in samples]
    # Teach copying, not guessing: keep episodes whose answer is visible in what was retrieved.
    kept = [t for t in trajs if answer_visible(t)]
    log.info("SFT: %d of %d synthesised episodes show their answer in the observations (%d of them search "
             "more than once)", len(kept), len(trajs), sum(t.num_searches > 1 for t in kept))
    trajs = kept or trajs
    n_direct = min(len(samples), round(frac * len(trajs) / (1.0 - frac)))
    if n_direct:
        trajs = trajs + [direct_trajectory(tok, protocol, s) for s in rng.sample(samples, n_direct)]
        log.info("SFT: %d of %d episodes answer without searching", n_direct, len(trajs))
    return trajs


def missed_after_question_episodes(cfg, tok, retriever) -> list[Trajectory]:
    """The `missed_after_question` SFT episodes: the episode `rollout.first_action: question` with
    `second_action: search` makes, written out. The runner's search of the question (masked, the
    index's own top k), the second search's opening (masked), one query naming a gold title that the
    question or those passages name but did not show (the only query the policy writes, so the only
    one SFT teaches), its results with that gold put in, then the answer. A question with no such
    title, or whose answer the observations do not show, is left out: its episode would teach a query
    copied from nothing, or an answer guessed."""
    # Three turns whatever rollout.max_turns allows: the question's search, the one query, the answer
    # (a longer budget would let missed_gold search a third time, in a turn no runner opens).
    r = replace(cfg.rollout, max_turns=3)
    passages = corpus_passages(cfg.data.index, cfg.data.corpus)
    protocol = get_protocol(cfg.agent)
    rng = random.Random(cfg.seed)
    trajs = [synth_trajectory(tok, protocol, s, retriever, passages, r, rng, runner_first="question",
                              next_query="missed_gold", runner_second=True) for s in gold_samples(cfg)]
    kept = [t for t in trajs if t.num_searches == 2 and answer_visible(t)]
    log.info("SFT: %d of %d questions have a gold title the question's own top %d name but do not show, "
             "and an episode that shows the answer", len(kept), len(trajs), r.topk)
    if not kept:
        raise ConfigError(f"sft.builder=missed_after_question found no question in {cfg.data.train} whose own "
                          f"top {r.topk} name a gold title they do not show; use sft.builder=gold_search_missed")
    return kept


# The core's warm start, registered like a method's (`sft.builder: gold_search`, the default).
SFT_BUILDERS.register("gold_search", lambda cfg, model, tok, retriever: warm_start_episodes(cfg, tok, retriever))
SFT_BUILDERS.register("gold_search_missed", lambda cfg, model, tok, retriever: warm_start_episodes(
    cfg, tok, retriever, next_query="missed_gold"))
SFT_BUILDERS.register("missed_after_question", lambda cfg, model, tok, retriever: missed_after_question_episodes(
    cfg, tok, retriever))
