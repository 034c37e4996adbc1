"""Format rewards: does the response follow its protocol's grammar?

>>> good = "<think>easy</think><answer> Paris </answer>"
>>> format_reward(good, {"answers": ["Paris"]})
1.0
>>> format_reward(good + " and more text", {"answers": ["Paris"]})
0.0
"""
from __future__ import annotations

from ragrl.rewards.qa import protocol_of, response_text
from ragrl.rollout.protocol import TextProtocol
from ragrl.rollout.trajectory import Trajectory


def is_well_formed(completion, protocol: str | TextProtocol | None = None, default: str | None = None) -> bool:
    """A trajectory with no format error whose text passes `is_valid_format`, or such a string."""
    if isinstance(completion, Trajectory) and completion.format_errors > 0:
        return False
    proto = protocol_of(completion, protocol, default)
    return proto.is_valid_format(response_text(completion))


def format_reward(completion, sample=None, protocol: str | TextProtocol | None = None) -> float:
    """1.0 if the whole response follows the protocol (default: the trajectory's, else the protocol for plain text)."""
    return float(is_well_formed(completion, protocol))
