"""MMOA-RAG (Chen et al.): rewriter → retriever → selector → generator, three LLM agents.

Pure text handling for the pipeline runner (ragrl.methods.mmoa.pipeline): each agent's prompt, how
its output is read, and the penalty flag its reward adds to the shared answer F1. Settings follow
the released code: at most 4 sub-questions, a shared budget of 10 candidates, selector ids
`Document0,Document4`, penalties for over-long or malformed outputs.

>>> parse_subquestions("1. Who directed Jaws?\\n2. When was he born?", "q")
(['Who directed Jaws?', 'When was he born?'], False)
>>> split_budget(3)
[4, 3, 3]
>>> parse_selection("Document0,Document4", 6)
([0, 4], False)
>>> parse_selection("Document0,Document0", 6)
([0], True)
"""
from __future__ import annotations

import re

from ragrl.errors import ConfigError
from ragrl.retrieval.base import Hit
from ragrl.rollout.protocol import TextProtocol

MAX_SUBQUESTIONS = 4
MAX_LINES = 8                 # more lines than this: unusable, fall back to the question
MAX_REWRITE_CHARS = 300
TOTAL_CANDIDATES = 10
BUDGETS = {1: [10], 2: [5, 5], 3: [4, 3, 3], 4: [3, 3, 2, 2]}
MAX_ANSWER_WORDS = 30
AGENTS = ("rewriter", "selector", "generator")

REWRITER_SYSTEM = ("Break the question into the simple sub-questions needed to answer it, one per line "
                   "(at most 4). If it is already simple, write it unchanged.")
SELECTOR_SYSTEM = ("Choose the documents that help answer the question. Write only their ids, separated "
                   "by commas, e.g. Document0,Document3.")
GENERATOR_SYSTEM = "Answer the question from the documents in a few words, with no explanation."

_NUMBERING = re.compile(r"^\s*(?:[-*•]|\(?\d+[.):]|sub-?question\s*\d*\s*[:.])\s*", re.IGNORECASE)
_SELECTION = re.compile(r"^Document(\d+)$")


def split_budget(n_subquestions: int, total: int = TOTAL_CANDIDATES) -> list[int]:
    """Candidates per sub-question sharing `total` (the released code's table for 10)."""
    if total == TOTAL_CANDIDATES and n_subquestions in BUDGETS:
        return list(BUDGETS[n_subquestions])
    base, extra = divmod(total, n_subquestions)
    return [base + (i < extra) for i in range(n_subquestions)]


def parse_subquestions(text: str, question: str) -> tuple[list[str], bool]:
    """(sub-questions, penalized). Numbering and bullets are stripped; more than 4 are cut to 4;
    no line, or more than 8, falls back to the original question. Penalized (−0.5 in the
    reward) when it wrote more than 4 or over 300 characters."""
    text = text if isinstance(text, str) else ""
    lines = [_NUMBERING.sub("", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    penalized = len(lines) > MAX_SUBQUESTIONS or len(text.strip()) > MAX_REWRITE_CHARS
    if not lines or len(lines) > MAX_LINES:
        return [question], penalized
    return lines[:MAX_SUBQUESTIONS], penalized


def parse_selection(text: str, n_docs: int) -> tuple[list[int], bool]:
    """(kept ids in order, penalized). Penalized (−1) for output that is malformed, out of range
    or repeats an id; the well-formed, in-range, first occurrences are still kept."""
    parts = [p.strip() for p in (text or "").split(",")]
    ids, penalized = [], not parts or parts == [""]
    for p in parts:
        m = _SELECTION.match(p)
        if not m:
            penalized = True
            continue
        i = int(m.group(1))
        if i >= n_docs or i in ids:
            penalized = True
            continue
        ids.append(i)
    return ids, penalized


def selector_f1(metrics: dict, beta: float = 1.0) -> float:
    """F1 (F-beta) of the selector's kept documents against the gold passages, from the pipeline
    runner's `selector_precision` / `selector_recall` (0 where they are missing).

    >>> selector_f1({"selector_precision": 0.5, "selector_recall": 1.0}), selector_f1({})
    (0.6666666666666666, 0.0)
    >>> selector_f1({"selector_precision": 0.5, "selector_recall": 1.0}, beta=2.0)   # 5 * .5 / (4 * .5 + 1)
    0.8333333333333334
    """
    p, r = metrics.get("selector_precision", 0.0), metrics.get("selector_recall", 0.0)
    b2 = beta * beta
    return (1 + b2) * p * r / (b2 * p + r) if p + r else 0.0


def generator_penalized(answer: str | None) -> bool:
    """Penalized (−1) for an answer over 30 words."""
    return len((answer or "").split()) > MAX_ANSWER_WORDS


def _docs(hits: list[Hit], words: int) -> str:
    return "\n".join(f"Document{i}: {h.title}. {' '.join(h.text.split()[:words])}" for i, h in enumerate(hits))


class MMOAProtocol(TextProtocol):
    """The three role prompts; episodes run through the pipeline runner, not the multi-turn loop."""

    name = "mmoa"
    runner = "pipeline"
    answering_agent = "generator"      # whose trajectory an evaluation scores
    agents = AGENTS
    stop_strings: list[str] = []

    def __init__(self, passage_words: int = 40):
        self.passage_words = passage_words

    def rewriter_messages(self, question: str) -> list[dict]:
        return [{"role": "system", "content": REWRITER_SYSTEM}, {"role": "user", "content": f"Question: {question}"}]

    def selector_messages(self, question: str, hits: list[Hit]) -> list[dict]:
        return [{"role": "system", "content": SELECTOR_SYSTEM},
                {"role": "user", "content": f"Question: {question}\n{_docs(hits, self.passage_words)}"}]

    def generator_messages(self, question: str, hits: list[Hit]) -> list[dict]:
        docs = _docs(hits, self.passage_words) if hits else "(no documents)"
        return [{"role": "system", "content": GENERATOR_SYSTEM},
                {"role": "user", "content": f"{docs}\nQuestion: {question}"}]

    def messages(self, question: str) -> list[dict]:
        return self.rewriter_messages(question)

    def extract_answer(self, text: str) -> str | None:
        answer = " ".join((text or "").split())
        return answer or None

    def is_valid_format(self, response: str) -> bool:
        return bool((response or "").strip())


def selector_grammar(tokenizer, n_docs: int):
    """allowed_tokens for the selector: `Document<d>` items (d < n_docs, no repeats) joined by
    commas, then end of sequence. Every sequence it admits parses without a penalty."""
    doc = tokenizer.encode("Document", add_special_tokens=False)
    comma = tokenizer.encode(",", add_special_tokens=False)
    digits = [tokenizer.encode(str(d), add_special_tokens=False) for d in range(min(n_docs, 10))]
    if len(doc) != 1 or len(comma) != 1 or any(len(d) != 1 for d in digits):
        raise ConfigError("the selector grammar needs 'Document', ',' and each digit to be single tokens "
                          "in this tokenizer")
    doc_id, comma_id, digit_ids = doc[0], comma[0], [d[0] for d in digits]
    eos = sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} - {None})

    def allowed(generated: list[int]) -> list[int]:
        if not generated or generated[-1] == comma_id:
            return [doc_id]
        if generated[-1] == doc_id:
            used = {t for t in generated if t in digit_ids}
            return [d for d in digit_ids if d not in used]
        used = {t for t in generated if t in digit_ids}
        return ([comma_id] if len(used) < len(digit_ids) else []) + eos

    return allowed
