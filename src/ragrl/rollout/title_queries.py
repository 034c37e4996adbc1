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

`rollout.title_fallback: question` adds the question itself as a candidate, served as the question's
next passages: a title that misses costs the passages naive RAG would have shown next (candidate W's
titles that were not a missed gold one, 76% of its episodes, cost −4.1 of search gain on U's 450
held-apart questions), so a policy that may keep reading the question's list has a title to choose
only where one pays (issue #53's candidate AE).

`rollout.title_notes: first_sentence` writes the candidates into the second search's thought, each with
the first sentence of its first passage, before the policy chooses (issue #53's candidate AC): choosing
among bare names, a 135M chooser learned a point or less from RL (candidates AA, AB), and a name alone
rarely says whether its page is the question's bridge (a person, a film, a place).
"""
from __future__ import annotations

import re
import weakref
from collections import defaultdict
from collections.abc import Sequence

from ragrl.errors import ConfigError, RagrlError
from ragrl.retrieval.base import Retriever, TitleLister
from ragrl.rollout.protocol import NEXT_SEARCH_THOUGHT, TextProtocol
from ragrl.rollout.trajectory import Trajectory
from ragrl.text import normalize_answer

# Longer titles are rare and would make every phrase lookup longer.
MAX_TITLE_WORDS = 8
# A note's words and the titles noted in one thought: twelve notes of 16 words (about 360 tokens) fit
# the Search-R1 shape's second turn after its first observation; a question has 4.9 candidates on
# average and more than 12 in 0.6% of `pool-train` episodes (the rest are left out of the thought,
# not of the choice).
NOTE_WORDS = 16
MAX_NOTED_TITLES = 12
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def first_sentence(text: str, max_words: int = NOTE_WORDS) -> str:
    """A passage's first sentence, cut to `max_words` words ("..." marks a cut).

    >>> first_sentence("Janet Waldo (1920 - 2016) was an American actress. She voiced Judy Jetson.")
    'Janet Waldo (1920 - 2016) was an American actress.'
    >>> first_sentence("one two three four", max_words=2)
    'one two ...'
    """
    words = _SENTENCE_END.split(text.strip(), maxsplit=1)[0].split()
    return " ".join(words[:max_words] + (["..."] if len(words) > max_words else []))


class TitleGazetteer:
    """The corpus's titles by their normalised phrase, to find the ones a text names.

    With the corpus's texts (row by row, as the titles), a title's note is the first sentence of its
    first passage in corpus order.

    >>> g = TitleGazetteer(["Golden State Warriors", "NBA draft", "The Warriors", "Warriors"],
    ...                    texts=["A team. Based in San Francisco.", "", "A film.", "A band."])
    >>> g.named_in("The NBA Draft was held by the Golden State Warriors.", exclude={"nba draft"})
    ['Golden State Warriors', 'The Warriors']
    >>> g.note("Golden State Warriors"), g.note("NBA draft")
    ('A team.', '')
    """

    def __init__(self, titles: Sequence[str], max_words: int = MAX_TITLE_WORDS,
                 texts: Sequence[str] | None = None):
        self.titles, self.texts = titles, texts
        self.by_phrase: dict[str, str] = {}
        for title in titles:
            phrase = normalize_answer(title)
            if phrase and len(phrase.split()) <= max_words:
                self.by_phrase.setdefault(phrase, title)   # the first spelling in corpus order
        # Each title's first row, built at the first note: a run without notes never pays for it.
        self._first_row: dict[str, int] | None = None
        self.max_words = max((len(p.split()) for p in self.by_phrase), default=0)

    def note(self, title: str) -> str:
        """The first sentence of `title`'s first passage; '' for a title with no text, or no texts."""
        if self.texts is None:
            return ""
        if self._first_row is None:
            self._first_row = {}
            for row, t in enumerate(self.titles):
                self._first_row.setdefault(t, row)
        row = self._first_row.get(title)
        return "" if row is None else first_sentence(self.texts[row])

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
        _GAZETTEERS[retriever] = TitleGazetteer(retriever.corpus_titles(), texts=retriever.corpus_texts())
    return _GAZETTEERS[retriever]


def title_candidates(gazetteer: TitleGazetteer, traj: Trajectory) -> list[str]:
    """The titles an episode's second query may be: named in its question or its first search's
    observation, and not among the titles that search showed."""
    first = traj.turns[0]
    shown = {normalize_answer(t) for titles in first.passage_titles for t in titles}
    return gazetteer.named_in(f"{traj.question} {first.observation}", exclude=shown)


def notes_thought(gazetteer: TitleGazetteer, traj: Trajectory, max_titles: int = MAX_NOTED_TITLES) -> str:
    """The second search's thought under `rollout.title_notes`: the episode's candidate titles (the
    first `max_titles` in sorted order), each with its note, one a line; the plain thought without any.

    >>> from ragrl.rollout.trajectory import Turn
    >>> g = TitleGazetteer(["Cats", "Tom Hooper", "Les Mis"], texts=["A musical.", "An English director. B.", "x"])
    >>> t = Trajectory("q", "Who directed Cats?", [], [], [], [], prompt_len=0)
    >>> t.turns.append(Turn(action_text="", kind="search", passage_titles=[["Cats"]],
    ...                     observation="Cats was directed by Tom Hooper."))
    >>> print(notes_thought(g, t))
    I need more information. Titles I can search:
    - Tom Hooper: An English director.
    """
    titles = title_candidates(gazetteer, traj)[:max_titles]
    if not titles:
        return NEXT_SEARCH_THOUGHT
    lines = [f"- {t}: {note}" if (note := gazetteer.note(t)) else f"- {t}" for t in titles]
    return "\n".join([f"{NEXT_SEARCH_THOUGHT} Titles I can search:", *lines])


# `title_query_trie`'s answer for an episode of an enumerated group with no candidate left to take.
NO_TITLE_LEFT = object()


def fallback_query(question: str) -> str:
    """The question as `rollout.title_fallback: question` writes it as a query (its whitespace closed up).

    >>> fallback_query("  Who directed   Jaws? ")
    'Who directed Jaws?'
    """
    return " ".join(question.split())


def question_next_pages(retriever: Retriever, trajs: list[Trajectory], topk: int) -> list[list]:
    """`rollout.title_fallback: question`'s passages, one list per trajectory, from one batched search:
    each question's best `topk` rows past those its episode's earlier searches showed (its first search
    being the question's own top k, these are its next k, so the episode shows what naive RAG's top 2k
    would)."""
    shown = [{pid for turn in t.turns[:-1] for ids in turn.passage_ids for pid in ids} for t in trajs]
    found = retriever.search([fallback_query(t.question) for t in trajs], topk + max(map(len, shown), default=0))
    return [[h for h in hits if h.id not in seen][:topk] for hits, seen in zip(found, shown)]


def title_query_trie(tok, protocol: TextProtocol, gazetteer: TitleGazetteer, traj: Trajectory,
                     copy: int = 0, every: int = 0, fallback: bool = False) -> QueryTrie | None | object:
    """The constraint of an episode's second query (None: no candidate, the query is free).

    fallback (`rollout.title_fallback: question`): the question itself is the first candidate.
    every > 0 (`rollout.title_group: every`, with n = every): the episode is copy `copy` of its question's
    group and takes that copy's candidate alone (a trie of one sequence, so the policy's log-prob of it
    is still recorded); past the candidates it gets NO_TITLE_LEFT, except copy 0 of a question with
    none, which writes freely. The episode's metrics record its group's candidates and whether n cut them."""
    titles = ([fallback_query(traj.question)] if fallback else []) + title_candidates(gazetteer, traj)
    if every:
        scalars = traj.metrics.setdefault("scalars", {})
        scalars["title_candidates"] = float(len(titles))
        scalars["title_candidates_cut"] = float(len(titles) > every)
        if copy >= max(len(titles), 1):
            return NO_TITLE_LEFT
        titles = titles[copy: copy + 1]
    close = protocol.query[1]
    return QueryTrie([tok.encode(f" {t} {close}", add_special_tokens=False) for t in titles]) if titles else None
