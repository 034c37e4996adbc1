"""Search-behaviour rewards: cost per search, a bonus for searching, gold recall, answer in the
retrieved documents, and the search's outcome: the answer's rank and the gain over the question.

>>> r = "<think>look</think><search> Jaws director </search><information>Doc 1</information><answer>x</answer>"
>>> search_count(r)
1
>>> search_cost_reward(r, {}, cost=0.25)
-0.25
"""
from __future__ import annotations

import math

from ragrl.errors import ConfigError, RagrlError
from ragrl.rewards.qa import answer_in, golds_of, is_yes_no, protocol_of, response_text
from ragrl.rollout.protocol import TextProtocol
from ragrl.rollout.trajectory import Trajectory


def search_count(completion, protocol: str | TextProtocol | None = None) -> int:
    """Search *actions* taken (a multi-query RAG-R1 search counts once).

    Trajectory → `num_searches`; text → the protocol's own count (`TextProtocol.count_searches`), so a
    new protocol gets every search-based reward without a change here.
    """
    if isinstance(completion, Trajectory):
        return completion.num_searches
    return protocol_of(completion, protocol).count_searches(response_text(completion))


def search_cost_reward(completion, sample=None, cost: float = 0.1, protocol: str | TextProtocol | None = None) -> float:
    """SmartRAG's retrieval cost: −cost for every search action."""
    return -cost * search_count(completion, protocol)


def retrieval_reward(completion, sample=None, bonus: float = 0.5, protocol: str | TextProtocol | None = None) -> float:
    """R1-Searcher stage 1's retrieve reward: `bonus` (0.5) if the rollout searched at least once.

    >>> retrieval_reward("<answer>x</answer>", {})
    0.0
    """
    return bonus if search_count(completion, protocol) >= 1 else 0.0


def gold_recall(hit_ids: list[str], gold_ids: list[str]) -> float:
    """The share of `gold_ids` among `hit_ids` (0.0 without gold ids): the one gold recall that the
    reward, training's step rows, `ragrl eval` and `ragrl compare` all read.

    >>> gold_recall(["a", "b", "c"], ["b", "z"])
    0.5
    """
    golds = set(gold_ids)
    return len(golds & set(hit_ids)) / len(golds) if golds else 0.0


def gold_recall_reward(completion, sample) -> float:
    """Fraction of the sample's `gold_passage_ids` that the rollout retrieved (any turn).

    A ragrl addition (no paper uses it as is): a dense signal for learning to search, as the
    answer reward is sparse on a small model. 0.0 when the sample lists no gold passages.
    """
    if not isinstance(completion, Trajectory):
        raise RagrlError("gold_recall needs a Trajectory (text holds no passage ids)")
    return gold_recall(completion.retrieved_ids, (sample or {}).get("gold_passage_ids") or [])


def answer_in_docs_reward(completion, sample) -> float:
    """1.0 if a gold answer occurs (SQuAD-normalised, whole words) in a retrieved document.

    DeepRetrieval's idea (reward the retriever when what it found holds the answer): unlike
    `gold_recall` it needs no gold passage ids, and it credits the passage that *answers* a
    multi-hop question, not only the first hop's. Yes/no questions score 0.0 (every passage
    holds "yes" or "no" somewhere, so there is no signal). Reads the search turns' observations.

    >>> from ragrl.rollout.trajectory import Trajectory, Turn
    >>> t = Trajectory("q1", "Who directed Jaws?", ["Steven Spielberg"], [], [], [], 0,
    ...                turns=[Turn("Jaws", "search", observation="Jaws. A 1975 film by Steven Spielberg.")])
    >>> answer_in_docs_reward(t, {"answers": ["Steven Spielberg"]})
    1.0
    >>> answer_in_docs_reward(t, {"answers": ["George Lucas"]})
    0.0
    """
    if not isinstance(completion, Trajectory):
        raise RagrlError("answer_in_docs needs a Trajectory (text alone does not say which part was retrieved)")
    golds = golds_of(completion, sample)
    if not golds or is_yes_no(golds):
        return 0.0
    # A last search served but not shown (rollout.end_after_searches) has passages, no observation.
    return answer_in([t.observation or " ".join(p for ps in t.passage_texts for p in ps)
                      for t in completion.turns if t.kind == "search"], golds)


# ---------------------------------------------------------------- what a search found (issue #53)
# Rewards on the search's outcome rather than the answer: the signal that teaches agents below 1.5B
# to search (DeepRetrieval's answer rank, s3's gain beyond RAG). Both read the passages' own texts
# as the index holds them (Turn.passage_texts), in the order the episode's searches retrieved them.

# (rank bound, reward), bounds rising: the first answer-bearing passage at rank <= bound earns that
# tier's reward (the tightest bound it meets); a later rank earns 0 (DeepRetrieval's tiers, in [0, 1]).
ANSWER_RANK_TIERS = ((1, 1.0), (3, 0.7), (6, 0.4), (10, 0.2))


def first_answer_rank(texts: list[str], golds: list[str]) -> int | None:
    """1-based rank of the first text holding a gold answer (whole words, normalised); None if none.

    >>> first_answer_rank(["Jaws is a film.", "Directed by Steven Spielberg."], ["steven spielberg"])
    2
    >>> first_answer_rank(["nothing here"], ["Spielberg"]) is None
    True
    """
    for rank, text in enumerate(texts, 1):
        if answer_in([text], golds):
            return rank
    return None


def _shown_texts(completion, name: str) -> list[str]:
    if not isinstance(completion, Trajectory):
        raise RagrlError(f"{name} needs a Trajectory (text alone does not say which passages were retrieved)")
    shown = completion.shown_passages()
    if any(not text for _, text in shown):
        raise RagrlError(f"{name} reads each retrieved passage's text, and this episode's runner recorded ids "
                         "only (Turn.passage_texts): use it with the multi-turn or retrieval-only runner")
    return [text for _, text in shown]


def answer_rank_reward(completion, sample, tiers: list | tuple = ANSWER_RANK_TIERS) -> float:
    """Tiers by the rank of the first passage the episode's searches retrieved that holds a gold
    answer, over the distinct passages in the order they came (DeepRetrieval's reward, for an agent's
    searches). 0.0 for no search, no such passage, or a yes/no question (every passage holds a yes).

    >>> from ragrl.rollout.trajectory import Trajectory, Turn
    >>> found = lambda *texts: Trajectory("q", "Who directed Jaws?", [], [], [], [], 0, turns=[
    ...     Turn("Jaws", "search", queries=["Jaws"], passage_ids=[[f"p{i}" for i in range(len(texts))]],
    ...          passage_texts=[list(texts)])])
    >>> answer_rank_reward(found("Jaws, by Steven Spielberg."), {"answers": ["Steven Spielberg"]})
    1.0
    >>> answer_rank_reward(found("a", "b", "Spielberg directed it."), {"answers": ["Spielberg"]})
    0.7
    >>> answer_rank_reward(found("a", "b", "c", "d", "Spielberg"), {"answers": ["Spielberg"]}, tiers=[[2, 1.0], [5, 0.5]])
    0.5
    >>> answer_rank_reward(found("a", "b"), {"answers": ["Spielberg"]})
    0.0
    """
    golds = golds_of(completion, sample)
    texts = _shown_texts(completion, "answer_rank")
    if not golds or is_yes_no(golds):
        return 0.0
    return tier_reward(first_answer_rank(texts, golds), tiers)


def check_answer_rank(tiers: list | tuple = ANSWER_RANK_TIERS) -> None:
    """answer_rank's tiers: [[rank bound >= 1, reward], ...], bounds rising, rewards finite.

    >>> check_answer_rank([[3, 1.0], [1, 0.5]])
    Traceback (most recent call last):
    ...
    ragrl.errors.ConfigError: reward 'answer_rank': tiers must be [[rank bound, reward], ...] with rising bounds >= 1, got [[3, 1.0], [1, 0.5]]
    """
    check_rank_tiers("answer_rank", tiers)


def check_rank_tiers(name: str, tiers) -> None:
    """A rank reward's tiers (`name`'s, for the message): [[rank bound >= 1, reward], ...], bounds
    rising, rewards finite."""
    ok = isinstance(tiers, (list, tuple)) and len(tiers) > 0
    bounds = []
    for tier in tiers if ok else []:
        if not (isinstance(tier, (list, tuple)) and len(tier) == 2 and isinstance(tier[0], int)
                and not isinstance(tier[0], bool) and tier[0] >= 1 and isinstance(tier[1], (int, float))
                and not isinstance(tier[1], bool) and math.isfinite(tier[1])):
            ok = False
            break
        bounds.append(tier[0])
    if not ok or bounds != sorted(set(bounds)):
        raise ConfigError(f"reward {name!r}: tiers must be [[rank bound, reward], ...] with rising bounds >= 1, "
                          f"got {tiers!r}")


def tier_reward(rank: int | None, tiers) -> float:
    """The reward of the tightest tier whose bound `rank` meets; 0.0 past the last or for None.

    >>> tier_reward(2, ((1, 1.0), (3, 0.7))), tier_reward(4, ((1, 1.0), (3, 0.7))), tier_reward(None, ((1, 1.0),))
    (0.7, 0.0, 0.0)
    """
    if rank is None:
        return 0.0
    return next((float(value) for bound, value in tiers if rank <= bound), 0.0)   # rising bounds: the tightest met


# The key a training question carries for `search_gain`: the rank of the first answer-bearing
# passage in the question's own top passages from the run's index (None: none within the depth),
# written by `question_answer_ranks` before the rewards run.
QUESTION_RANK = "question_answer_rank"


def question_answer_ranks(samples: list[dict], retriever, depth: int) -> None:
    """Write QUESTION_RANK into each sample that lacks it: the question itself as the query, its top
    `depth` passages from `retriever` (one batched search for all of them)."""
    todo = [s for s in samples if QUESTION_RANK not in s]
    if not todo:
        return
    hits = retriever.search([s["question"] for s in todo], depth)
    for sample, found in zip(todo, hits):
        golds = golds_of(None, sample)
        sample[QUESTION_RANK] = None if is_yes_no(golds) else first_answer_rank(
            [h.full_text for h in found], golds)


def search_gain_reward(completion, sample, min_n: int = 3) -> float:
    """Gain over the question at equal passages (s3's "gain beyond RAG", on the passages): 1 if the
    passages the episode's searches showed hold a gold answer, minus 1 if the question's own top N
    from the same index does, N the number of distinct passages shown but at least `min_n` (naive
    RAG's k: without that floor an episode that never searches scores 0, as good as searching with the
    question, and probe P2 learned to stop searching). In {-1, 0, 1}; 0 for a yes/no question. Needs
    the sample's `question_answer_rank` (the trainer writes it: question_answer_ranks).

    >>> from ragrl.rollout.trajectory import Trajectory, Turn
    >>> t = Trajectory("q", "Who directed Jaws?", [], [], [], [], 0, turns=[Turn("Jaws director", "search",
    ...     queries=["Jaws director"], passage_ids=[["p1", "p2"]], passage_texts=[["Jaws (film)", "Spielberg directed Jaws"]])])
    >>> search_gain_reward(t, {"answers": ["Spielberg"], "question_answer_rank": None})   # found what the question did not
    1.0
    >>> search_gain_reward(t, {"answers": ["Spielberg"], "question_answer_rank": 2})      # the question finds it at rank 2 too
    0.0
    >>> search_gain_reward(t, {"answers": ["Lucas"], "question_answer_rank": 1})          # missed what the question found
    -1.0
    >>> no_search = Trajectory("q", "Who directed Jaws?", [], [], [], [], 0)
    >>> search_gain_reward(no_search, {"answers": ["Spielberg"], "question_answer_rank": 3})   # naive RAG's 3 find it
    -1.0
    >>> search_gain_reward(no_search, {"answers": ["Spielberg"], "question_answer_rank": 3}, min_n=0)
    0.0
    """
    golds = golds_of(completion, sample)
    texts = _shown_texts(completion, "search_gain")
    if not isinstance(sample, dict) or QUESTION_RANK not in sample:
        raise RagrlError(f"search_gain needs the sample's {QUESTION_RANK!r} (ragrl.rewards.search."
                         "question_answer_ranks writes it before the rewards run)")
    if not golds or is_yes_no(golds):
        return 0.0
    rank = sample[QUESTION_RANK]
    question_hit = rank is not None and rank <= max(len(texts), min_n)
    return answer_in(texts, golds) - float(question_hit)


def check_search_gain(min_n: int = 3) -> None:
    """search_gain's floor: a whole number of passages >= 0.

    >>> check_search_gain(-1)
    Traceback (most recent call last):
    ...
    ragrl.errors.ConfigError: reward 'search_gain': min_n must be a whole number >= 0, got -1
    """
    if isinstance(min_n, bool) or not isinstance(min_n, int) or min_n < 0:
        raise ConfigError(f"reward 'search_gain': min_n must be a whole number >= 0, got {min_n!r}")


# Rewards that read what a question's own search finds: the trainer runs question_answer_ranks first.
search_gain_reward.needs_question_rank = True


# The key a trajectory's metrics carry for `query_rank`: the best rank, over the queries the policy's
# searches sent (not a search the runner wrote: rollout.first_action: question), of the first
# answer-bearing passage in that query's own top passages from the run's index, searched deeper than
# the episode was shown (None: none within the depth). The trainer writes it (query_answer_ranks)
# before the rewards run.
QUERY_RANK = "query_answer_rank"
# Deeper than answer_rank's: a query that brings the answer to rank 8 is nearer to one that shows it
# than a query that loses it altogether, and only a search deeper than the 3 shown can tell them apart.
QUERY_RANK_TIERS = ((1, 1.0), (3, 0.7), (10, 0.4), (30, 0.2))


def query_answer_ranks(trajs: list, samples: dict[str, dict], retriever, depth: int) -> None:
    """Write QUERY_RANK into each trajectory's metrics: every query the policy's searches sent,
    searched again for its top `depth` (one batched search for the step), the best rank of a passage
    holding a gold answer of its sample (`samples` by sample id). A search the runner wrote (the
    question, rollout.first_action: question) is not the policy's query: left out, so that a query
    which loses what the question found is not paid the question's rank. No query, or a yes/no
    question: None."""
    asked: list[tuple[int, str]] = []
    golds = [golds_of(t, samples[t.sample_id]) for t in trajs]
    for i, t in enumerate(trajs):
        t.metrics[QUERY_RANK] = None
        if not is_yes_no(golds[i]):
            asked += [(i, q) for q in t.policy_queries]
    hits = retriever.search([q for _, q in asked], depth) if asked else []
    for (i, _), found in zip(asked, hits):
        t = trajs[i]
        rank = first_answer_rank([h.full_text for h in found], golds[i])
        best = t.metrics[QUERY_RANK]
        if rank is not None and (best is None or rank < best):
            t.metrics[QUERY_RANK] = rank


def query_rank_reward(completion, sample, tiers: list | tuple = QUERY_RANK_TIERS) -> float:
    """DeepRetrieval's reward at depth: tiers by the rank of the first passage holding a gold answer in
    the policy's own queries' top passages (a search the runner wrote is not one), searched deeper
    than the passages it was shown (the deepest tier's bound), the best over its queries. It grades a
    query that loses the answer from the shown 3 by how far it pushed it, where answer_rank and
    search_gain score every such query alike. 0.0 for no search, no such passage within the depth,
    or a yes/no question. Needs the trajectory's `query_answer_rank` (the trainer writes it:
    query_answer_ranks).

    >>> from ragrl.rollout.trajectory import Trajectory
    >>> t = Trajectory("q", "Who directed Jaws?", [], [], [], [], 0, metrics={"query_answer_rank": 8})
    >>> query_rank_reward(t, {"answers": ["Spielberg"]})
    0.4
    >>> query_rank_reward(t, {"answers": ["Spielberg"]}, tiers=[[5, 1.0], [50, 0.1]])
    0.1
    >>> query_rank_reward(Trajectory("q", "Is it?", [], [], [], [], 0, metrics={"query_answer_rank": None}), {"answers": ["yes"]})
    0.0
    """
    if not isinstance(completion, Trajectory):
        raise RagrlError("query_rank needs a Trajectory (text alone does not say which queries were searched)")
    if QUERY_RANK not in completion.metrics:
        raise RagrlError(f"query_rank needs the trajectory's {QUERY_RANK!r} (ragrl.rewards.search."
                         "query_answer_ranks writes it before the rewards run)")
    return tier_reward(completion.metrics[QUERY_RANK], tiers)


def check_query_rank(tiers: list | tuple = QUERY_RANK_TIERS) -> None:
    """query_rank's tiers, as answer_rank's.

    >>> check_query_rank([[0, 1.0]])
    Traceback (most recent call last):
    ...
    ragrl.errors.ConfigError: reward 'query_rank': tiers must be [[rank bound, reward], ...] with rising bounds >= 1, got [[0, 1.0]]
    """
    check_rank_tiers("query_rank", tiers)


# The trainer searches each episode's queries again, as deep as the deepest tier, before scoring.
query_rank_reward.needs_query_rank = True
