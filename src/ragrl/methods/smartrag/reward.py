"""SmartRAG's reward (Gao et al., ICLR 2025; the released config): right answers with few retrievals.

    reward = EM + F1 (each the max over gold aliases, so 0-2) - cost x retrievals - penalty if a step
             could not be parsed

>>> smartrag_reward("[Search] Jaws director\\n[Documents]Doc 1 ...[/Documents]\\n[Answer] Steven Spielberg",
...                 {"answers": ["Steven Spielberg"]})
1.8
>>> smartrag_reward("[Answer] Spielberg", {"answers": ["Steven Spielberg"]}, cost=0.5)
0.6666666666666666
>>> smartrag_reward("I think it is Spielberg", {"answers": ["Steven Spielberg"]})
-1.0
"""
from __future__ import annotations

from ragrl.rewards.qa import answer_of, exact_match, f1_score, golds_of, protocol_of, response_text
from ragrl.rewards.search import search_count
from ragrl.rollout.protocol import TextProtocol
from ragrl.rollout.trajectory import Trajectory


def has_unparseable_step(completion, protocol: str | TextProtocol | None = None) -> bool:
    """A trajectory that recorded a format error, or a response some step of which does not parse."""
    if isinstance(completion, Trajectory):
        return completion.format_errors > 0
    proto = protocol_of(completion, protocol, default="smartrag")
    text = response_text(completion)
    parts = proto.steps(text)
    if parts is None:
        return not proto.is_valid_format(text)
    return not parts or any(proto.parse(p).kind == "invalid" for p in parts)


def smartrag_reward(completion, sample, cost: float = 0.2, invalid_penalty: float = 1.0,
                    protocol: str | TextProtocol | None = None) -> float:
    """EM + F1 − cost per retrieval − `invalid_penalty` for an unparseable step (module docstring)."""
    proto = protocol_of(completion, protocol, default="smartrag")
    golds = golds_of(completion, sample)
    if has_unparseable_step(completion, proto):
        return -invalid_penalty - cost * _searches(completion, proto)
    answer = answer_of(completion, proto)
    return exact_match(answer, golds) + f1_score(answer, golds) - cost * _searches(completion, proto)


def _searches(completion, proto) -> int:
    return search_count(completion, proto)
