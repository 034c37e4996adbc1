"""Query-focused passage snippets: keep the sentences that matter within a word budget.

Prefilling retrieved text dominates CPU time, so observations must be short; but cutting a
passage to its first N words often drops the sentence that holds the answer. A snippet keeps
the passage's first sentence (it usually says what the entity is) plus the sentences sharing
the most words with the query, in their original order, until the budget is spent.
"""
from __future__ import annotations

import re

from ragrl.retrieval.base import Hit

_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("""a an the of in on at to for from by with and or is was are were be been
as that this which who whom whose what when where why how did does do it its his her their
into than then also not no yes""".split())


def _terms(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def truncate_words(text: str, n_words: int) -> str:
    """The first `n_words` words, with ' ...' when something was cut.

    >>> truncate_words("one two three", 2)
    'one two ...'
    """
    words = text.split()
    return text if len(words) <= n_words else " ".join(words[:n_words]) + " ..."


def snippet(text: str, query: str, n_words: int) -> str:
    """At most ~`n_words` words of `text`: first sentence + the sentences closest to `query`.

    >>> t = "Paris is the capital of France. It has many museums. The Eiffel Tower was built in 1889."
    >>> snippet(t, "when was the eiffel tower built", 14)
    'Paris is the capital of France. ... The Eiffel Tower was built in 1889.'
    """
    words = text.split()
    if len(words) <= n_words:
        return text
    sents = [s for s in _SENT.split(text.strip()) if s]
    if len(sents) <= 1:
        return truncate_words(text, n_words)
    q = _terms(query)
    # First sentence always; then by overlap with the query (ties: earlier first).
    ranked = [0] + sorted(range(1, len(sents)), key=lambda i: (-len(q & _terms(sents[i])), i))
    chosen, used = [], 0
    for i in ranked:
        n = len(sents[i].split())
        if used + n > n_words:
            if not chosen:
                return truncate_words(text, n_words)
            continue
        chosen.append(i)
        used += n
    chosen.sort()
    parts = []
    for j, i in enumerate(chosen):
        if j and i != chosen[j - 1] + 1:
            parts.append("...")
        parts.append(sents[i])
    if chosen[-1] != len(sents) - 1:
        parts.append("...")
    return " ".join(parts)


def squash(text: str) -> str:
    """Collapse runs of whitespace (newlines included) into single spaces."""
    return " ".join(text.split())


def format_hits(hits: list[Hit]) -> str:
    """The document list every tag protocol shows (Search-R1's layout): one `Doc i (Title: "t") text` line per hit."""
    if not hits:
        return "(no results)"
    return "\n".join(f'Doc {i} (Title: "{h.title}") {h.text.strip()}' for i, h in enumerate(hits, 1))
