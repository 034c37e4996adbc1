"""Text normalisation shared by the answer metrics and the rollout's title queries.

It sits below every layer so that a rollout setting (`rollout.second_query: title`) matches titles
in what an episode read exactly as the SFT builders and the rewards compare answers.
"""
from __future__ import annotations

import re
import string

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and articles, collapse whitespace.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    """
    text = "".join(ch for ch in (text or "").lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())
