"""Prompts for the two evaluation baselines: answer directly, or read retrieved passages first.

No tags: a baseline answers in plain text and `baseline_answer` takes its first line.

>>> direct_messages("Who directed Jaws?")[1]["content"]
'Question: Who directed Jaws?'
>>> baseline_answer("Answer: Steven Spielberg.\\nHe also directed E.T.")
'Steven Spielberg.'
"""
from __future__ import annotations

from dataclasses import replace

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit
from ragrl.rollout.snippets import format_hits, snippet, squash

BASELINE_SYSTEM = "Answer the question with a few words on one line. Do not explain."
# A baseline's answer budget in tokens (greedy, up to its first newline): naive RAG's, and the
# reader's of `rollout.answer_by: reader`, which reads an episode's passages with naive RAG's prompt.
BASELINE_ANSWER_TOKENS = 32


def _question(question: str) -> str:
    if not isinstance(question, str) or not question.strip():
        raise RagrlError(f"the question must be a non-empty string, got {question!r}")
    return question.strip()


def direct_messages(question: str) -> list[dict[str, str]]:
    """No retrieval: the model answers from what it knows."""
    return [
        {"role": "system", "content": BASELINE_SYSTEM},
        {"role": "user", "content": f"Question: {_question(question)}"},
    ]


def naive_rag_messages(question: str, hits: list[Hit], passage_words: int | None = None) -> list[dict[str, str]]:
    """Retrieve once with the question, put the passages before it: each cut to its snippet of
    `passage_words` words for the question (None: as given). Naive RAG's prompt, and the one
    `rollout.answer_by: reader` reads an episode's passages with."""
    question = _question(question)
    if passage_words is not None:
        hits = [replace(h, text=snippet(h.text, question, passage_words)) for h in hits]
    return [
        {"role": "system", "content": BASELINE_SYSTEM},
        {"role": "user", "content": f"Passages:\n{format_hits(hits)}\n\nQuestion: {question}"},
    ]


def baseline_answer(text: str, max_chars: int = 200) -> str:
    """The first non-empty line of a baseline's reply, without an `Answer:` prefix."""
    for line in (text or "").splitlines():
        line = squash(line)
        if line.lower().startswith("answer:"):
            line = line[len("answer:"):].strip()
        if line:
            return line[:max_chars]
    return ""
