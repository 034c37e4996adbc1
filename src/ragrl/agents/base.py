"""Protocol: the pure-text side of an agent (prompt, stop strings, parser, observation).

A protocol never touches a model or a retriever, so it is testable on strings alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ragrl.retrieval.base import Hit

ActionKind = Literal["search", "answer", "invalid", "continue"]


@dataclass
class Action:
    """What one generated turn asks for.

    search: `queries` holds one or more non-empty queries.
    answer: `answer` holds the final answer text.
    invalid: `error` says what was wrong (counts as a format error; the loop feeds back a hint).
    continue: the model stopped without acting (e.g. only thought); the loop nudges it on.
    """

    kind: ActionKind
    queries: list[str] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None


class Protocol:
    """Base class of the agent protocols (search_r1, rag_r1, r1_searcher, ...)."""

    name: str = "base"
    #: strings that end a generation turn (the closing tag of an action)
    stop_strings: list[str] = []
    #: the names of its agents where one episode holds several (MMOA-RAG); () for a single policy
    agents: tuple[str, ...] = ()

    def messages(self, question: str) -> list[dict[str, str]]:
        """Chat messages that open an episode (the engine applies the chat template)."""
        raise NotImplementedError

    def parse(self, text: str) -> Action:
        """Parse one generated turn. Never raises: malformed text becomes an invalid Action."""
        raise NotImplementedError

    def format_observation(self, queries: list[str], hits: list[list[Hit]]) -> str:
        """The text appended after a search action, grouping documents per query."""
        raise NotImplementedError

    def format_feedback(self, error: str) -> str:
        """The text appended after an invalid action."""
        raise NotImplementedError

    def extract_answer(self, text: str) -> str | None:
        """The final answer in a whole response, or None."""
        raise NotImplementedError

    def is_valid_format(self, response: str) -> bool:
        """Whether a whole response (actions and observations) follows the protocol."""
        raise NotImplementedError

    def count_searches(self, response: str) -> int:
        """Search actions in a whole response's text (rewards read this, whatever the protocol)."""
        from ragrl.errors import RagrlError
        raise RagrlError(f"the {self.name} protocol cannot count searches in text; pass a Trajectory")

    def has_tags(self, text: str) -> bool:
        """Whether the text holds any tag of this protocol (a protocol response, not a plain reply)."""
        return False
