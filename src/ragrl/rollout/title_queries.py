"""`rollout.second_query: title`: the second search's query is a corpus title the episode has read.

Why: a 135M searcher warm-started to copy a missed gold title from what it read names one in about
one episode in ten (issue #53's candidates U and V), about as often as a blind pick would among the
few titles its question and first passages name (a median of 4 on `pool-train`). Its free second
query wanders: on `agent-confirm` 42% named no title it had read and 44% one its first search had
already shown. Constraining the query to the titles it read (GENRE's constrained decoding over
Wikipedia titles) leaves the policy the choice that matters, which title, and gives a group of
samples queries that differ, so a group estimator has something to compare.

The candidates are every corpus title (SQuAD-normalised) that occurs as a phrase in the question or
in the first search's observation, less the titles that search showed. The query written is the
title as the corpus spells it, then the protocol's closing tag, tokenised as the SFT episodes write
it (` Title </search>`), so every warm-start target is one of them. An episode with no candidate
writes its query freely. Sampling is restricted to the candidates' tokens; the recorded log-probs
stay the model's own (see `SamplingParams.allowed_tokens`).

In training, `rollout.title_group: every` hands a question's episodes its candidates one each instead
of sampling among them, for the `enumerated` estimator (issue #53's candidate Y: with a median of
four titles, eight samples mostly drew the same one, and 93% of groups were flat).
"""
from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Iterable

from ragrl.errors import ConfigError, RagrlError
from ragrl.retrieval.base import Retriever, TitleLister
from ragrl.rollout.protocol import TextProtocol
from ragrl.rollout.trajectory import Trajectory
from ragrl.text import normalize_answer

# Longer titles are rare and would make every phrase lookup longer.
MAX_TITLE_WORDS = 8


class TitleGazetteer:
    """The corpus's titles by their normalised phrase, to find the ones a text names.

    >>> g = TitleGazetteer(["Golden State Warriors", "NBA draft", "The Warriors", "Warriors"])
    >>> g.named_in("The NBA Draft was held by the Golden State Warriors.", exclude={"nba draft"})
    ['Golden State Warriors', 'The Warriors']
    """

    def __init__(self, titles: Iterable[str], max_words: int = MAX_TITLE_WORDS):
        self.by_phrase: dict[str, str] = {}
        for title in titles:
            phrase = normalize_answer(title)
            if phrase and len(phrase.split()) <= max_words:
                self.by_phrase.setdefault(phrase, title)   # the first spelling in corpus order
        self.max_words = max((len(p.split()) for p in self.by_phrase), default=0)

    def named_in(self, text: str, exclude: set[str] = frozenset()) -> list[str]:
        """The titles (as the corpus spells them) whose phrase occurs in `text`, less those whose
        normalised phrase is in `exclude`; sorted, so an episode's candidates do not depend on order."""
        words = normalize_answer(text).split()
        found = set()
        for i in range(len(words)):
            for n in range(1, min(self.max_words, len(words) - i) + 1):
                phrase = " ".join(words[i:i + n])
                if phrase in self.by_phrase and phrase not in exclude:
                    found.add(self.by_phrase[phrase])
        return sorted(found)


class QueryTrie:
    """`SamplingParams.allowed_tokens` over a fixed set of token sequences: the ids that continue
    one of them after the tokens generated so far. Each sequence ends in a stop string, so the
    engine ends the turn at a sequence's end and no query outside them can be written.

    >>> trie = QueryTrie([[5, 6, 9], [5, 7, 9]])
    >>> trie([]), trie([5]), trie([5, 7])
    ([5], [6, 7], [9])
    """

    def __init__(self, sequences: list[list[int]]):
        if not sequences or any(not s for s in sequences):
            raise RagrlError("a query trie needs at least one non-empty token sequence")
        following: dict[tuple[int, ...], set[int]] = defaultdict(set)
        for seq in sequences:
            for i, token in enumerate(seq):
                following[tuple(seq[:i])].add(token)
        self.following = {prefix: sorted(ids) for prefix, ids in following.items()}

    def __call__(self, generated: list[int]) -> list[int]:
        allowed = self.following.get(tuple(generated))
        if allowed is None:   # the engine did not stop at a sequence's closing tag
            raise RagrlError(f"a title-constrained query went past its titles after {len(generated)} tokens "
                             "(its closing tag did not end the turn)")
        return allowed


_GAZETTEERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def gazetteer_of(retriever: Retriever | None) -> TitleGazetteer:
    """The retriever's titles as a gazetteer, built once per retriever; refused where it cannot list them."""
    if not isinstance(retriever, TitleLister):
        raise ConfigError(f"rollout.second_query=title (or question_title) needs a retriever that lists its corpus's titles (an "
                          f"in-process index); {type(retriever).__name__} does not: set rollout.second_query=free")
    if retriever not in _GAZETTEERS:
        _GAZETTEERS[retriever] = TitleGazetteer(retriever.corpus_titles())
    return _GAZETTEERS[retriever]


def title_candidates(gazetteer: TitleGazetteer, traj: Trajectory) -> list[str]:
    """The titles an episode's second query may be: named in its question or its first search's
    observation, and not among the titles that search showed."""
    first = traj.turns[0]
    shown = {normalize_answer(t) for titles in first.passage_titles for t in titles}
    return gazetteer.named_in(f"{traj.question} {first.observation}", exclude=shown)


def check_title_group(cfg) -> None:
    """`rollout.title_group: every` hands out the titles `second_query` chooses among: refused without one."""
    if cfg.title_group == "every" and cfg.second_query == "free":
        raise ConfigError("rollout.title_group=every gives each episode of a group one of the titles that "
                          "rollout.second_query=title (or question_title) chooses among; this run's second "
                          "query is free: set second_query, or title_group: sample")


# `title_query_trie`'s answer for an episode of an enumerated group with no candidate left to take.
NO_TITLE_LEFT = object()


def title_query_trie(tok, protocol: TextProtocol, gazetteer: TitleGazetteer, traj: Trajectory,
                     copy: int = 0, every: int = 0) -> QueryTrie | None | object:
    """The constraint of an episode's second query (None: no candidate, the query is free).

    every > 0 (`rollout.title_group: every`, with n = every): the episode is copy `copy` of its question's
    group and takes that copy's candidate alone (a trie of one sequence, so the policy's log-prob of it
    is still recorded); past the candidates it gets NO_TITLE_LEFT, except copy 0 of a question with
    none, which writes freely. The episode's metrics record its group's candidates and whether n cut them."""
    titles = title_candidates(gazetteer, traj)
    if every:
        scalars = traj.metrics.setdefault("scalars", {})
        scalars["title_candidates"] = float(len(titles))
        scalars["title_candidates_cut"] = float(len(titles) > every)
        if copy >= max(len(titles), 1):
            return NO_TITLE_LEFT
        titles = titles[copy: copy + 1]
    close = protocol.query[1]
    return QueryTrie([tok.encode(f" {t} {close}", add_special_tokens=False) for t in titles]) if titles else None
