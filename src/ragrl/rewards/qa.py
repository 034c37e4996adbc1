"""Answer metrics (SQuAD normalisation, EM, token F1, cover EM) and the rewards built on them.

A reward is a plain function `f(completion, sample, **options) -> float`: `completion` is a
`Trajectory` or the response text, `sample` the question dict with `answers` (gold + aliases).

>>> sample = {"answers": ["Steven Spielberg", "Spielberg"]}
>>> em_reward("<think>easy</think><answer> spielberg. </answer>", sample)
1.0
>>> f1_reward("<answer>Steven Allan Spielberg</answer>", sample)
0.8
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

from ragrl.errors import RagrlError
from ragrl.rollout.protocol import TextProtocol, default_text_protocol, get_protocol
from ragrl.rollout.snippets import squash
from ragrl.rollout.trajectory import Trajectory
from ragrl.text import normalize_answer

# HotpotQA's official F1: a yes/no/noanswer prediction or gold scores 0 unless they are equal
_SPECIAL = {"yes", "no", "noanswer"}


# ------------------------------------------------------------------ what a completion holds
@lru_cache(maxsize=None)
def _protocol(name: str) -> TextProtocol:
    return get_protocol(name)


def protocol_of(completion, protocol: str | TextProtocol | None = None, default: str | None = None) -> TextProtocol:
    """The protocol to read a completion with: the argument, else the one the trajectory
    recorded in `metrics["protocol"]`, else `default`, else the registry's protocol for plain
    text (the one a method record declares as the default)."""
    if isinstance(protocol, TextProtocol):
        return protocol
    if protocol is None and isinstance(completion, Trajectory):
        protocol = completion.metrics.get("protocol")
    return _protocol(protocol or default or default_text_protocol())


def response_text(completion) -> str:
    """The response as text: a string as is; a trajectory's turns, actions and observations."""
    if isinstance(completion, Trajectory):
        return "".join(turn.action_text + turn.observation for turn in completion.turns)
    if isinstance(completion, str):
        return completion
    raise RagrlError(f"a completion must be a Trajectory or a str, got {type(completion).__name__}")


def answer_of(completion, protocol: str | TextProtocol | None = None) -> str:
    """The predicted answer ('' when there is none).

    Trajectory → its parsed `.answer`. String → the first answer block; a string with no tag
    of the protocol at all is a plain reply (an eval baseline) and is the answer as a whole.

    >>> answer_of("<think>hmm</think><answer> Paris </answer>")
    'Paris'
    >>> answer_of("Paris, France")
    'Paris, France'
    >>> answer_of("<think>I think it is Paris</think>")
    ''
    """
    if isinstance(completion, Trajectory):
        return completion.answer or ""
    text = response_text(completion)
    proto = protocol_of(completion, protocol)
    answer = proto.extract_answer(text)
    if answer is not None:
        return answer
    if proto.has_tags(text):  # a protocol response with no answer (a plain reply has no tags)
        return ""
    return squash(text)


def golds_of(completion, sample) -> list[str]:
    """The gold answers: `sample["answers"]`, else the trajectory's own `golds`."""
    if isinstance(sample, dict) and "answers" in sample:
        golds = sample["answers"]
    elif sample is None and isinstance(completion, Trajectory):
        golds = completion.golds
    else:
        raise RagrlError("a QA reward needs a sample with an 'answers' list")
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, list) or not all(isinstance(g, str) for g in golds):
        raise RagrlError(f"sample 'answers' must be a list of strings, got {golds!r}")
    return golds


# ------------------------------------------------------------------------------- metrics
def _golds(golds) -> list[str]:
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(pred: str, golds: list[str] | str) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer.

    >>> exact_match("the Beatles", ["Beatles"])
    1.0
    """
    norm = normalize_answer(pred)
    return float(any(norm == normalize_answer(g) for g in _golds(golds)))


def _token_f1(pred: str, gold: str) -> float:
    if (pred in _SPECIAL or gold in _SPECIAL) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str, golds: list[str] | str) -> float:
    """Token F1 against the best-matching alias (HotpotQA's yes/no/noanswer rule included).

    >>> f1_score("Paris France", ["Paris"])
    0.6666666666666666
    >>> f1_score("no", ["not really"])
    0.0
    """
    norm = normalize_answer(pred)
    return max((_token_f1(norm, normalize_answer(g)) for g in _golds(golds)), default=0.0)


def cover_em(pred: str, golds: list[str] | str) -> float:
    """1.0 if a normalised gold answer occurs in the normalised prediction as whole tokens.

    Search-R1's "cover EM" tests plain substring containment; ragrl matches whole tokens so
    that gold "no" is not found in "not sure" (nor "art" in "start").

    >>> cover_em("it was the Beatles in 1962", ["beatles"])
    1.0
    >>> cover_em("not sure", ["no"])
    0.0
    """
    norm = f" {normalize_answer(pred)} "
    for gold in _golds(golds):
        gold_norm = normalize_answer(gold)
        if gold_norm and f" {gold_norm} " in norm:
            return 1.0
    return 0.0


# ------------------------------------------------------------------------------- rewards
def em_reward(completion, sample, protocol: str | TextProtocol | None = None) -> float:
    """Exact match of the completion's answer."""
    return exact_match(answer_of(completion, protocol), golds_of(completion, sample))


def f1_reward(completion, sample, protocol: str | TextProtocol | None = None) -> float:
    """Token F1 of the completion's answer."""
    return f1_score(answer_of(completion, protocol), golds_of(completion, sample))


def cover_em_reward(completion, sample, protocol: str | TextProtocol | None = None) -> float:
    """Cover EM of the completion's answer.

    >>> cover_em_reward("<answer>It was Steven Spielberg</answer>", {"answers": ["Spielberg"]})
    1.0
    """
    return cover_em(answer_of(completion, protocol), golds_of(completion, sample))


_TAG = re.compile(r"<[^<>\n]*>")


def answer_in(texts: list[str], answers: list[str]) -> float:
    """1.0 if a (normalised) gold answer occurs as whole words in one of the texts.

    Markup tags (`<information>`, `<|end_of_documents|>`) are word boundaries: removing their
    punctuation alone would glue "Spielberg.</information>" into one word.

    >>> answer_in(["Steven Spielberg directed Jaws."], ["steven spielberg"])
    1.0
    >>> answer_in(["Spielbergs"], ["Spielberg"])
    0.0
    >>> answer_in(["<information>Doc 1: directed by Spielberg.</information>"], ["Spielberg"])
    1.0
    """
    golds = [normalize_answer(a) for a in answers]
    for t in texts:
        t = f" {normalize_answer(_TAG.sub(' ', t))} "
        if any(g and f" {g} " in t for g in golds):
            return 1.0
    return 0.0


def is_yes_no(answers: list[str]) -> bool:
    return bool(answers) and all(normalize_answer(a) in ("yes", "no") for a in answers)
