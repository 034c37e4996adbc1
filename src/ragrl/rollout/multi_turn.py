"""The multi-turn search episode runner: questions in, token-level Trajectories out.

One step of the loop, for every still-active trajectory at once:
  1. generate one turn (until a protocol stop string, EOS or the turn budget), batched;
  2. parse each turn into an Action (search / answer / invalid);
  3. send *every* query of *every* searching trajectory in ONE retriever call;
  4. tokenise each observation once and append it with action_mask 0.
Steps 3-4 are `retrieval_step.py`'s; an episode under construction is `episode_state.EpisodeState`.

With an engine that runs whole episodes (`run_turns`: the static engine) and
`rollout.turns_in_slot` (the default), steps 2-4 run whenever turns end, for the turns that ended
together, and each episode's next turn continues in its slot at once: no turn waits for the
slowest row of the batch. The trajectories are built by the same functions either way.

Token-in/token-out: a trajectory is only ever extended by ids (sampled ids from the engine,
observation ids from the tokenizer), never re-tokenised from text, so the ids the trainer
scores are exactly the ids the model saw while sampling.

This module knows nothing about training: it imports only the engine, protocol and
retriever interfaces.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

from ragrl.engines.base import Engine, Generation, NextTurn, SamplingParams
from ragrl.errors import ConfigError
from ragrl.retrieval.base import DocumentSampler, Retriever
from ragrl.rollout.config import RolloutConfig, check_forced_turns
from ragrl.rollout.episode_state import EpisodeState, append_observation
from ragrl.rollout.protocol import NEXT_SEARCH_THOUGHT, Action, TextProtocol, chat_ids
from ragrl.rollout.retrieval_step import retrieve_and_observe, search_the_question
from ragrl.rollout.start_answers import AnsweringTurn, answer_by_reader, answer_by_start, check_start_can_answer
from ragrl.rollout.title_queries import (NO_TITLE_LEFT, QueryTrie, TitleGazetteer, fallback_query, gazetteer_of,
                                        notes_thought, title_query_trie)
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory, Turn


def episode_deadline(cfg: RolloutConfig, rollout_start: float, episode_start: float) -> float | None:
    """The `time.monotonic()` instant an episode must end by: `max_episode_s` after the episode's own
    start or `max_rollout_s` after the rollout's, whichever comes first; None when neither is set."""
    bounds = []
    for name, start in (("max_episode_s", episode_start), ("max_rollout_s", rollout_start)):
        seconds = getattr(cfg, name)
        if seconds is None:
            continue
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ConfigError(f"rollout.{name} must be a number of seconds > 0 (or null: no bound), got {seconds!r}")
        bounds.append(start + seconds)
    return min(bounds, default=None)


def prompt_ids(tokenizer, protocol: TextProtocol, question: str) -> list[int]:
    """Chat-templated prompt ids for one question (generation prompt appended)."""
    return chat_ids(tokenizer, protocol.messages(question))


def run_episodes(
    engine: Engine,
    protocol: TextProtocol,
    retriever: Retriever | None,
    samples: list[dict],
    cfg: RolloutConfig,
    *,
    group_offset: int = 0,
) -> tuple[list[Trajectory], dict[str, float]]:
    """Roll out `cfg.n` trajectories per sample; return them (sample-major) and timings. Under
    `cfg.title_group: every` a sample keeps one per candidate title (at most n; one if it has none).

    samples: dicts with at least `id`, `question`, `answers`.
    Returns (trajectories, stats) where stats has generate_s, retrieval_s, gen_tokens and timeouts
    (trajectories ended by a wall-time bound).

    Wall-time bounds: an episode must end `cfg.max_episode_s` after its own start and
    `cfg.max_rollout_s` after this call's start, whichever comes first (here every episode starts
    with the call, so both count from entry). Each turn's SamplingParams carry that deadline, so
    the engine cuts a row at it while the others go on; a cut turn is kept as the action tokens
    it has and ends the episode (stop_reason "timeout", no answer, no retrieval). Retrieval is
    never interrupted, but an episode past its deadline ends before its next turn, ungenerated.
    """
    rollout_start = time.monotonic()   # at entry: building the prompts counts against max_rollout_s
    if cfg.answer_by != "policy":
        check_start_can_answer(engine, protocol, cfg.answer_by)
    # Every episode of this runner starts with the rollout, so its own clock starts at entry too.
    deadline = episode_deadline(cfg, rollout_start, episode_start=rollout_start)
    tok = engine.tokenizer
    # A forced first search: its opening is part of the prompt (masked: the policy did not write it)
    # and of the first turn's text, so the turn parses, and is scored, as the whole search it is.
    opening = protocol.search_opening() if cfg.first_action == "search" else ""
    check_forced_turns(cfg)
    closing = _closing(protocol, cfg, tok)
    title_rule, gazetteer = None, None
    if cfg.second_query != "free":   # refused here, before any turn, where the retriever lists no titles
        gazetteer = gazetteer_of(retriever)
        every = cfg.n if cfg.title_group == "every" else 0
        fallback = cfg.title_fallback == "question"
        title_rule = lambda traj, copy: title_query_trie(tok, protocol, gazetteer, traj, copy, every,   # noqa: E731
                                                         fallback)
    again = _again(protocol, cfg, tok, gazetteer)
    opening_ids = tok.encode(opening, add_special_tokens=False) if opening else []
    states: list[EpisodeState] = []
    for i, s in enumerate(samples):
        p = prompt_ids(tok, protocol, s["question"]) + opening_ids
        for copy in range(cfg.n):
            states.append(EpisodeState(Trajectory(
                sample_id=str(s.get("id", i)), question=s["question"], golds=list(s.get("answers", [])),
                token_ids=list(p), action_mask=[0] * len(p), logprobs=[0.0] * len(p),
                prompt_len=len(p), group=group_offset + i, metrics={"protocol": protocol.name},
            ), deadline=deadline, opening=opening, closing=closing, again=again,
                title_rule=title_rule, copy=copy))
    stats = {"generate_s": 0.0, "retrieval_s": 0.0, "gen_tokens": 0, "timeouts": 0}
    # Each turn re-sends the whole episode; an engine that can keeps the KV of the previous turns
    # (valid for this call only: the weights do not change inside one rollout).
    caching = getattr(engine, "prefix_caching", None)
    sampling_rng = None
    if isinstance(retriever, DocumentSampler):   # a retriever policy draws its documents: seeded per rollout
        sampling_rng = torch.Generator().manual_seed(int(cfg.seed or 0))
    if cfg.first_action == "question":
        search_the_question(states, protocol, retriever, tok, cfg, stats, sampling_rng)
    # A constrained turn (second_query: title, question_title) needs a per-token callback, which slots do not run.
    if cfg.turns_in_slot and hasattr(engine, "run_turns") and cfg.second_query == "free":
        _run_in_slots(engine, protocol, retriever, states, cfg, stats, sampling_rng)
    else:
        with caching() if caching is not None else contextlib.nullcontext():
            _run_turn_by_turn(engine, protocol, retriever, states, cfg, stats, sampling_rng, deadline)
    for st in states:
        if not st.done:
            st.end(EpisodeEnd.MAX_TURNS)
    answering = [AnsweringTurn(st.traj, st.turn_start, st.turn_opening) for st in states
                 if st.traj.stop_reason == EpisodeEnd.ANSWER]
    if cfg.answer_by == "reader":
        answer_by_reader(engine, protocol, answering, cfg.passage_words, stats)
    elif cfg.answer_by != "policy":
        answer_by_start(engine, protocol, answering, cfg.max_turn_tokens, cfg.max_response_tokens, stats,
                        cfg.answer_by)
    stats["timeouts"] = sum(st.traj.stop_reason == EpisodeEnd.TIMEOUT for st in states)
    return [st.traj for st in states if st.traj.stop_reason != EpisodeEnd.UNUSED], stats


def _run_turn_by_turn(engine, protocol, retriever, states: list[EpisodeState], cfg: RolloutConfig, stats: dict,
                      sampling_rng, deadline: float | None) -> None:
    """Every still-active episode's turn t in one `generate` call, then one retrieval call for all."""
    tok = engine.tokenizer
    first_turn = 1 if cfg.first_action == "question" else 0    # the runner took the first
    for turn_idx in range(first_turn, cfg.max_turns):
        if deadline is not None:   # past it (a long retrieval, a slow turn): end before generating
            now = time.monotonic()
            for st in states:
                if not st.done and now >= st.deadline:
                    _time_out(st, None, tok)
        for st in states:
            if not st.done:
                _open_turn(st, cfg)   # under answer_by: start/base/reader a last turn ends the episode for it to answer
        active = [st for st in states if not st.done]
        if not active:
            break
        params = [_turn_params(st.traj, cfg, turn_idx, protocol.stop_strings, st.deadline, st.allowed)
                  for st in active]
        t0 = time.perf_counter()
        gens = engine.generate([st.traj.token_ids for st in active], params)
        stats["generate_s"] += time.perf_counter() - t0
        for st, g in zip(active, gens):
            _end_turn(st, g[0], protocol, tok, cfg, stats)
            st.allowed = None   # the constraint was that turn's only
        searching = [st for st in active if st.pending_queries]
        if searching:
            retrieve_and_observe(searching, protocol, retriever, tok, cfg, stats, sampling_rng)


def _run_in_slots(engine, protocol, retriever, states: list[EpisodeState], cfg: RolloutConfig, stats: dict,
                  sampling_rng) -> None:
    """Whole episodes in one `engine.run_turns` call: whenever turns end, act on them (parse,
    retrieve for those that search, append observations) and hand each episode's next turn back."""
    tok = engine.tokenizer
    acting_s = 0.0     # time inside the callback: the rest of the call is decoding

    def turn_ends(ended: list[tuple[int, Generation]]) -> list[NextTurn | None]:
        nonlocal acting_s
        t0 = time.perf_counter()
        acted = [(states[e], g) for e, g in ended]
        marks = []
        for st, g in acted:
            marks.append(len(st.traj.token_ids) + len(g.token_ids))   # where this turn's observation starts
            _end_turn(st, g, protocol, tok, cfg, stats)
        searching = [st for st, _ in acted if st.pending_queries]
        if searching:
            retrieve_and_observe(searching, protocol, retriever, tok, cfg, stats, sampling_rng)
        answers: list[NextTurn | None] = []
        now = time.monotonic() if any(st.deadline is not None for st, _ in acted) else None
        for (st, _), mark in zip(acted, marks):
            if not st.done and now is not None and st.deadline is not None and now >= st.deadline:
                _time_out(st, None, tok)     # past its bound after retrieval: no next turn
            if not st.done:
                _open_turn(st, cfg)   # its ids join the observation handed to the engine
            if st.done:
                answers.append(None)
                continue
            params = _turn_params(st.traj, cfg, st.traj.num_turns, protocol.stop_strings, st.deadline)
            answers.append(NextTurn(observation=st.traj.token_ids[mark:], params=params))
        acting_s += time.perf_counter() - t0
        return answers

    for st in states:   # before every first turn, as before each turn turn by turn (first_action: question)
        if not st.done:
            _open_turn(st, cfg)
    going = [e for e, st in enumerate(states) if not st.done]   # all, unless the runner's own search ended one
    if going:
        first = [_turn_params(states[e].traj, cfg, states[e].traj.num_turns, protocol.stop_strings,
                              states[e].deadline) for e in going]
        # The engine counts an episode's budget from the ids it is handed, which hold the runner's own
        # first search under first_action: question (each turn's budget is cut to what is left anyway).
        budget = cfg.max_response_tokens - min(len(states[e].traj.token_ids) - states[e].traj.prompt_len
                                               for e in going)
        t0 = time.perf_counter()
        engine.run_turns([states[e].traj.token_ids for e in going], first,
                         lambda ended: turn_ends([(going[i], g) for i, g in ended]), max_episode_tokens=budget)
        stats["generate_s"] += time.perf_counter() - t0 - acting_s


def _again(protocol: TextProtocol, cfg: RolloutConfig, tok, gazetteer: TitleGazetteer | None
           ) -> Callable[[Trajectory], tuple[str, list[int]]] | None:
    """`rollout.second_action: search`'s opening of an episode's second turn (its text and ids); None:
    off. Under `rollout.title_notes` its thought lists the episode's candidate titles with their notes."""
    if cfg.second_action != "search":
        return None
    if cfg.title_notes != "none" and gazetteer is not None:
        def noted(traj: Trajectory) -> tuple[str, list[int]]:
            text = protocol.search_opening(notes_thought(gazetteer, traj), first=False)
            return text, tok.encode(text, add_special_tokens=False)
        return noted
    text = protocol.search_opening(NEXT_SEARCH_THOUGHT, first=False)
    fixed = text, tok.encode(text, add_special_tokens=False)
    return lambda traj: fixed


def _closing(protocol: TextProtocol, cfg: RolloutConfig, tok) -> tuple[str, list[int]] | None:
    """`rollout.last_action: answer`'s opening of the last turn (its text and ids); None: off."""
    if cfg.last_action != "answer":
        return None
    text = protocol.answer_opening()   # refuses a protocol without tagged answers
    return text, tok.encode(text, add_special_tokens=False)


def _open_turn(st: EpisodeState, cfg: RolloutConfig) -> None:
    """Before an episode's next turn, what the runner writes there: the forced answer's opening
    (last_action), or the second search's (second_action, after a first turn that searched)."""
    t = st.traj
    if st.again is not None and t.num_turns == 1 and t.num_searches == 1:
        _write_opening(st, *st.again(t))
        if st.title_rule is not None:
            st.allowed = st.title_rule(t, st.copy)
            if st.allowed is NO_TITLE_LEFT:   # title_group: every, past its question's titles
                st.allowed = None
                st.end(EpisodeEnd.UNUSED)
        return
    _open_last_turn(st, cfg)


def _write_opening(st: EpisodeState, text: str, ids: list[int]) -> None:
    """Append text the runner wrote in front of the next turn, masked (out of every loss), and let
    that turn's text start with it, so the turn parses as the action it is made to be."""
    st.traj.append_masked(ids)
    st.opening = text


def _open_last_turn(st: EpisodeState, cfg: RolloutConfig) -> None:
    """Before an episode's last turn (`rollout.last_action: answer`): append the answer opening, masked
    (the runner wrote it), and let the turn's text start with it, so the turn parses as the answer
    it is made to be. Under `answer_by: start` (`base`, `reader`) the turn ends there, for it to write."""
    if st.closing is None or st.traj.num_turns != cfg.max_turns - 1:
        return
    text, _ = st.closing
    _write_opening(st, *st.closing)
    t = st.traj
    if cfg.answer_by != "policy":   # the start (base, reader) writes the rest: the policy writes nothing here
        st.turn_start, st.turn_opening, st.opening = len(t.token_ids), text, ""
        t.num_turns += 1
        t.turns.append(Turn(action_text=text, kind="answer"))
        st.end(EpisodeEnd.ANSWER)


def _end_turn(st: EpisodeState, g: Generation, protocol: TextProtocol, tok, cfg: RolloutConfig, stats: dict) -> None:
    """Append a generated turn to its episode: cut at the wall-time bound, or acted on."""
    if g.stop_reason == "timeout":
        _time_out(st, g, tok)
    else:
        _apply_action(st, g, protocol, tok, cfg, last_turn=st.traj.num_turns == cfg.max_turns - 1)
    stats["gen_tokens"] += len(g.token_ids)


def _turn_params(traj: Trajectory, cfg: RolloutConfig, turn_idx: int, stop: list[str],
                 deadline: float | None = None, allowed: QueryTrie | None = None) -> SamplingParams:
    used = len(traj.token_ids) - traj.prompt_len
    budget = max(1, min(cfg.max_turn_tokens, cfg.max_response_tokens - used))
    seed = None if cfg.seed is None else cfg.seed * 1_000_003 + turn_idx
    return SamplingParams(max_new_tokens=budget, temperature=cfg.temperature, top_p=cfg.top_p,
                          stop=list(stop), n=1, seed=seed, deadline=deadline, allowed_tokens=allowed)


def _time_out(st: EpisodeState, g: Generation | None, tok) -> None:
    """End the episode at its wall-time bound: truncated, no answer. A turn the engine cut (`g`) is
    kept as the action tokens it has, with their log-probs (they were sampled, and the trainer
    must score what the model did), but not parsed: half a turn is no action, and an answer
    read from it would be one the model had not finished. A cut with no token is no turn."""
    t = st.traj
    if g is not None and g.token_ids:
        t.token_ids += g.token_ids
        t.action_mask += [1] * len(g.token_ids)
        t.logprobs += list(g.logprobs)
        t.num_turns += 1
        text = st.opening + (g.text or tok.decode(g.token_ids, skip_special_tokens=False))
        st.opening = ""
        t.turns.append(Turn(action_text=text, kind="truncated", error="cut at the wall-time bound"))
    st.pending_queries = []
    st.end(EpisodeEnd.TIMEOUT)


def _apply_action(st: EpisodeState, g: Generation, protocol: TextProtocol, tok, cfg: RolloutConfig,
                  *, last_turn: bool) -> None:
    """Append the sampled turn (mask 1) and decide what the episode does next."""
    t = st.traj
    st.turn_start, st.turn_opening = len(t.token_ids), st.opening
    t.token_ids += g.token_ids
    t.action_mask += [1] * len(g.token_ids)
    t.logprobs += list(g.logprobs)
    t.num_turns += 1
    # An engine that leaves `text` empty: decode without the final EOS, as HFEngine's text does,
    # so action_text never depends on which engine produced the turn.
    text_ids = g.token_ids[:-1] if g.stop_reason == "eos" else g.token_ids
    text = st.opening + (g.text or tok.decode(text_ids, skip_special_tokens=False))
    st.opening = ""
    action: Action = protocol.parse(text)
    turn = Turn(action_text=text, kind=action.kind, error=action.error)
    t.turns.append(turn)
    if action.kind == "answer":
        t.answer = action.answer
        st.end(EpisodeEnd.ANSWER)
        return
    if action.kind == "search" and cfg.max_searches is not None and t.num_searches >= cfg.max_searches:
        action = Action("invalid", error=f"search past the quota of {cfg.max_searches}")
        turn.kind, turn.error = action.kind, action.error
    if action.kind == "search":
        turn.queries = action.queries[: cfg.max_queries_per_call]
        st.next_page = (st.allowed is not None and cfg.title_fallback == "question"
                        and [fallback_query(q) for q in turn.queries] == [fallback_query(t.question)])
        # The runner searches the question, then what the policy wrote: the title it chose
        # (question_title), or any query (query_prefix: question, query expansion). The turn records
        # the query as searched; its action text keeps what the policy wrote.
        if ((st.allowed is not None and cfg.second_query == "question_title" and not st.next_page)
                or cfg.query_prefix == "question"):
            turn.queries = [f"{t.question} {q}" for q in turn.queries]
        t.num_searches += 1
        st.pending_queries = list(turn.queries)
        st.last_search = cfg.end_after_searches is not None and t.num_searches >= cfg.end_after_searches
        if st.last_search:
            return       # served whatever the turn or token budget: the episode ends on its passages
    else:
        t.format_errors += 1
        if protocol.invalid_ends_episode:
            # SmartRAG: an unparseable step ends the episode (its reward carries the penalty).
            st.end(EpisodeEnd.FORMAT_ERROR)
            return
        if g.stop_reason == "eos":
            # The model closed its turn without acting: nothing more will come from it.
            st.end(EpisodeEnd.NO_ANSWER)
            return
        # No hint after the final turn or once the budget is spent: no action would follow it.
        if not last_turn and len(t.token_ids) - t.prompt_len < cfg.max_response_tokens:
            obs = protocol.format_feedback(action.error or "no action")
            append_observation(st, turn, obs, tok.encode(obs, add_special_tokens=False), cfg)
    if last_turn and not st.done:
        st.pending_queries = []
        st.end(EpisodeEnd.MAX_TURNS)
    elif len(t.token_ids) - t.prompt_len >= cfg.max_response_tokens:
        st.pending_queries = []
        st.end(EpisodeEnd.MAX_TOKENS)
