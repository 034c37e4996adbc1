"""An observation's text within its token budget: the retrieved passages of one search action,
shortened to query-focused snippets (never the tags), as every runner and SFT builder appends them."""
from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from ragrl.retrieval.base import Hit
from ragrl.rollout.protocol import TextProtocol
from ragrl.rollout.snippets import snippet, truncate_words


class ObservationBudget(Protocol):
    """The two settings an observation is cut by (a RolloutConfig has them)."""

    max_obs_tokens: int
    passage_words: int


def build_observation(
    tokenizer, protocol: TextProtocol, queries: list[str], hits: list[list[Hit]], cfg: ObservationBudget
) -> tuple[str, list[int]]:
    """Format an observation within `max_obs_tokens`, shortening passages, never the tags.

    Passages shrink first (down to title only); if title-only documents still overflow (three
    queries x three documents do at the default budget), the lowest-ranked documents of every
    query are left out, then the query labels are cut. Only a budget smaller than the bare tags
    can still be exceeded. `turn.passage_ids` keeps every retrieved id either way.
    """
    budget = cfg.max_obs_tokens

    def render(qs: list[str], docs: list[list[Hit]]) -> tuple[str, list[int]]:
        text = protocol.format_observation(qs, docs)
        return text, tokenizer.encode(text, add_special_tokens=False)

    words = cfg.passage_words
    while True:
        short = _snippets(queries, hits, words)
        text, ids = render(queries, short)
        if len(ids) <= budget or words == 0:
            break
        words = _shrunk_words(words, budget, len(ids))
    for keep in range(max((len(hs) for hs in hits), default=0) - 1, -1, -1):
        if len(ids) <= budget:
            break
        text, ids = render(queries, [hs[:keep] for hs in short])
    if len(ids) > budget:  # long rag_r1 query labels: keep their first words
        text, ids = render([truncate_words(q, 6) for q in queries], [[] for _ in hits])
    return text, ids


def build_observations(tokenizer, protocol: TextProtocol, searches: list[tuple[list[str], list[list[Hit]]]],
                       cfg: ObservationBudget) -> list[tuple[str, list[int]]]:
    """`build_observation` for many searches (queries, hits) at once, with the same results: each
    round of renderings is tokenised in one batched call (the fast tokenizer encodes them in
    parallel; a call a rendering cost ~1 ms, most of an observation's time). Passages shrink in
    rounds as build_observation shrinks them; a search still over the budget with title-only
    passages is finished by build_observation itself."""
    budget, n = cfg.max_obs_tokens, len(searches)
    words = [cfg.passage_words] * n
    texts: list[str] = [""] * n
    ids: list[list[int]] = [[] for _ in range(n)]
    todo = list(range(n))
    while todo:
        rendered = [protocol.format_observation(searches[i][0], _snippets(*searches[i], words[i])) for i in todo]
        for i, text, row in zip(todo, rendered, tokenizer(rendered, add_special_tokens=False)["input_ids"]):
            texts[i], ids[i] = text, list(row)
        todo = [i for i in todo if len(ids[i]) > budget and words[i] > 0]
        for i in todo:   # build_observation's shrink rule, row by row
            words[i] = _shrunk_words(words[i], budget, len(ids[i]))
    return [(texts[i], ids[i]) if len(ids[i]) <= budget else build_observation(tokenizer, protocol, *searches[i], cfg)
            for i in range(n)]


def _shrunk_words(words: int, budget: int, tokens: int) -> int:
    # Shrink every passage proportionally to the overshoot; int() floors, so words always drops.
    return max(0, int(words * budget / tokens * 0.95))


def _snippets(queries: list[str], hits: list[list[Hit]], words: int) -> list[list[Hit]]:
    # Query-focused snippets: the answer sentence survives the cut more often than with a prefix.
    return [[replace(h, text=snippet(h.text, q, words)) for h in hs] for q, hs in zip(queries, hits)]
