"""Protocols by name: what a recipe's `protocol: search_r1` resolves to.

>>> get_protocol("rag_r1", max_queries=2).max_queries
2
>>> sorted(PROTOCOLS)
['mmoa', 'r1_searcher', 'rag_r1', 'search_r1', 'smartrag']
>>> sorted(TAG_PROTOCOLS)
['r1_searcher', 'rag_r1', 'search_r1', 'smartrag']
"""
from __future__ import annotations

from ragrl.agents.base import Protocol
from ragrl.agents.mmoa import MMOAProtocol
from ragrl.agents.r1_searcher import R1SearcherProtocol
from ragrl.agents.rag_r1 import RagR1Protocol
from ragrl.agents.search_r1 import SearchR1Protocol
from ragrl.agents.smartrag import SmartRAGProtocol
from ragrl.errors import ConfigError

PROTOCOLS: dict[str, type[Protocol]] = {
    cls.name: cls for cls in (SearchR1Protocol, RagR1Protocol, R1SearcherProtocol, SmartRAGProtocol, MMOAProtocol)
}
# The tag protocols, whose episodes the multi-turn runner plays (MMOA-RAG's is a pipeline).
TAG_PROTOCOLS = {name: cls for name, cls in PROTOCOLS.items() if getattr(cls, "runner", "multi_turn") == "multi_turn"}


def get_protocol(name: str | Protocol, **kwargs) -> Protocol:
    """A protocol instance by name (an instance passes through unchanged, if no kwargs)."""
    if isinstance(name, Protocol) and not kwargs:
        return name
    if name not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {name!r}; known protocols: {', '.join(sorted(PROTOCOLS))}")
    try:
        return PROTOCOLS[name](**kwargs)
    except TypeError as exc:  # an option the protocol does not have
        raise ConfigError(f"protocol {name!r}: {exc}") from None
