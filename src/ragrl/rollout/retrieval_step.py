"""The multi-turn runner's retrieval step: every query of every searching episode served in one batched
retriever call, the passages recorded on each turn and their observation appended (masked).

A retriever that can `sample` (HARR: the retriever is the policy) draws each query's documents, and the
draw is recorded on the trajectory as a retrieval action."""
from __future__ import annotations

import time

from ragrl.retrieval.base import DocumentSampler, Retriever
from ragrl.retrieval.stochastic import QueryRequest
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.episode_state import EpisodeState, append_observation
from ragrl.rollout.observations import build_observations
from ragrl.rollout.protocol import TextProtocol
from ragrl.rollout.title_queries import question_next_pages
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory, Turn


def search_the_question(states: list[EpisodeState], protocol: TextProtocol, retriever: Retriever | None, tok,
                        cfg: RolloutConfig, stats: dict, sampling_rng) -> None:
    """`rollout.first_action: question`: each episode's first turn is the runner's own search, with the
    question as its query, written (masked: the policy did not write it) and served in one retrieval
    call before the policy's first turn, so the policy starts from what naive RAG retrieves."""
    for st in states:
        t = st.traj
        text = protocol.search_action([t.question])
        t.append_masked(tok.encode(text, add_special_tokens=False))
        t.num_turns += 1
        t.num_searches += 1
        t.turns.append(Turn(action_text=text, kind="search", queries=[t.question], by_runner=True))
        st.pending_queries = [t.question]
    retrieve_and_observe(states, protocol, retriever, tok, cfg, stats, sampling_rng)


def retrieve_and_observe(searching: list[EpisodeState], protocol: TextProtocol, retriever: Retriever | None,
                         tok, cfg: RolloutConfig, stats: dict, generator=None) -> None:
    """One batched retrieval call for every query of every searching trajectory, its time added to
    `stats["retrieval_s"]`.

    A retriever that can `sample` (the retriever is the policy, HARR) draws each query's documents
    and the draw is recorded on the trajectory as a retrieval action; its query text carries the
    episode's question and earlier searches (history)."""
    t0 = time.perf_counter()
    owners = [st for st in searching for _ in st.pending_queries]
    flat = [q for st in searching for q in st.pending_queries]
    if retriever is not None and flat and isinstance(retriever, DocumentSampler):
        requests = [QueryRequest(st.traj.question, q, search_history(st.traj)) for st, q in zip(owners, flat)]
        drawn = retriever.sample(requests, cfg.topk, generator=generator)
        hits = [h for h, _ in drawn]
        for st, (_, action) in zip(owners, drawn):
            if action is not None:
                st.traj.retrievals.append(action)
    else:
        hits: list[list] = [[] for _ in flat]
        # title_fallback's question is served as its next passages, not its first ones again: it is left
        # out of the plain batch, so no query is searched twice
        for paged in (False, True):
            picked = [i for i, st in enumerate(owners) if st.next_page == paged]
            if retriever is None or not picked:
                continue
            found = (question_next_pages(retriever, [owners[i].traj for i in picked], cfg.topk) if paged
                     else retriever.search([flat[i] for i in picked], cfg.topk))
            for i, h in zip(picked, found):
                hits[i] = h
        for st in searching:
            st.next_page = False
    pos, searches = 0, []
    for st in searching:
        qs, st.pending_queries = st.pending_queries, []
        searches.append((qs, hits[pos: pos + len(qs)]))
        pos += len(qs)
    for st, (_, mine) in zip(searching, searches):
        turn = st.traj.turns[-1]
        turn.passage_ids = [[h.id for h in hs] for hs in mine]
        turn.passage_titles = [[h.title for h in hs] for hs in mine]
        turn.passage_texts = [[h.full_text for h in hs] for hs in mine]
        if st.last_search:
            # No turn follows, so no observation is built or appended (its tokens would be masked out
            # of every loss and only cost the update): the passages are on the turn for the rewards.
            st.end(EpisodeEnd.RETRIEVED)
    going_on = [(st, search) for st, search in zip(searching, searches) if not st.last_search]
    observations = build_observations(tok, protocol, [search for _, search in going_on], cfg)
    for (st, _), (obs, ids) in zip(going_on, observations):
        append_observation(st, st.traj.turns[-1], obs, ids, cfg)
    stats["retrieval_s"] += time.perf_counter() - t0


def search_history(traj: Trajectory) -> list[dict]:
    """Earlier searches of this episode as HARR's history: each sub-query and the titles it found
    (a Search-R1 generator states no intermediate answer, so what was retrieved stands for it)."""
    out = []
    for turn in traj.turns[:-1]:
        for i, q in enumerate(turn.queries):
            titles = turn.passage_titles[i] if i < len(turn.passage_titles) else []
            out.append({"sub_query": q, "status": "retrieved" if titles else "no result",
                        "answer": "; ".join(titles)})
    return out
