"""TextProtocol: the pure-text side of an agent (prompt, stop strings, parser, observation), and
the registry of protocols by name (what a recipe's `agent: search_r1` resolves to).

A protocol never touches a model or a retriever, so it is testable on strings alone. What a runner
or an SFT builder needs to know about a protocol is declared here, on the base class, with the
default every plain single-policy tag protocol has; a protocol overrides only what differs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ragrl.errors import ConfigError, RagrlError
from ragrl.registry import Registry
from ragrl.retrieval.base import Hit

ActionKind = Literal["search", "answer", "invalid", "continue"]

# The thought a first search opens with: the SFT warm start's episodes write it, and
# `rollout.first_action: search` (or `question`) writes it, so both open the episode alike.
SEARCH_THOUGHT = "I need to search for this."
# The thought a later search opens with: the SFT episodes' further searches and `rollout.second_action:
# search`'s alike.
NEXT_SEARCH_THOUGHT = "I need more information."
# The thought an answer after a search opens with, the SFT episodes' and `rollout.last_action:
# answer`'s alike (R1-Searcher must close the <think> its searches left open).
READ_THOUGHT = "The documents give the answer."


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


class TextProtocol:
    """Base class of the agent protocols; each method's lives in `ragrl.methods`."""

    name: str = "base"
    #: strings that end a generation turn (the closing tag of an action)
    stop_strings: list[str] = []
    # ---- capabilities the runners and builders read (declared, never probed)
    #: the episode runner that plays this protocol's episodes (a name in ragrl.rollout.runners.RUNNERS)
    runner: str = "multi_turn"
    #: the names of its agents where one episode holds several (MMOA-RAG); () for a single policy
    agents: tuple[str, ...] = ()
    #: whose trajectory holds the episode's answer when there are several agents; None: every one
    answering_agent: str | None = None
    #: an unparseable turn ends the episode (SmartRAG), instead of a feedback hint and another turn
    invalid_ends_episode: bool = False
    #: queries one search action may hold (RAG-R1: several, retrieved as one batch)
    max_queries: int = 1
    #: SFT rendering: the opening/closing think tags (None: the protocol has no think block)
    think: tuple[str, str] | None = None
    #: SFT rendering: queries are written inside the open think block (R1-Searcher)
    search_in_think: bool = False
    #: the open and close tags of a query (None: the protocol's policy writes no search action)
    query: tuple[str, str] | None = None
    #: the open and close tags of an answer (None: no tagged answer, so `rollout.answer_by: start` cannot act)
    answer: tuple[str, str] | None = None

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

    def search_opening(self, thought: str = SEARCH_THOUGHT, first: bool = True) -> str:
        """A search action's text up to and including its query's open tag (the thought first, where
        the protocol has one): what the SFT episodes write before a query, and what
        `rollout.first_action: search` (and `second_action: search`, first=False) puts in front of the
        policy's turn. A later search of a protocol that searches inside its open <think> goes on there.

        >>> class P(TextProtocol):
        ...     think, query = ("<think>", "</think>"), ("<search>", "</search>")
        >>> P().search_opening()
        '<think>I need to search for this.</think>\\n<search>'
        """
        if self.query is None:
            raise ConfigError(f"protocol {self.name!r} has no search action for its policy to open")
        if self.search_in_think:      # R1-Searcher: the query sits inside the open <think>
            return f"{self.think[0]} {thought} {self.query[0]}" if first else f" {thought} {self.query[0]}"
        think = f"{self.think[0]}{thought}{self.think[1]}\n" if self.think else ""
        return f"{think}{self.query[0]}"

    def search_action(self, queries: list[str], thought: str = SEARCH_THOUGHT, first: bool = True) -> str:
        """A whole search action (several queries joined by ';' where the protocol takes them): what
        the SFT episodes write, and what `rollout.first_action: question` writes for the question.

        >>> class P(TextProtocol):
        ...     query = ("<search>", "</search>")
        >>> P().search_action(["who wrote it"])
        '<search> who wrote it </search>'
        """
        return f"{self.search_opening(thought, first)} {'; '.join(queries)} {self.query[1]}"

    def answer_opening(self, thought: str | None = READ_THOUGHT, first: bool = False) -> str:
        """An answer action's text up to and including its answer's open tag: what the SFT episodes
        write before an answer, and what `rollout.last_action: answer` puts in front of an episode's
        last turn. thought=None writes no think block where the protocol allows that; `first`: no
        search came before (R1-Searcher's <think> is then not open yet).

        >>> class P(TextProtocol):
        ...     think, answer = ("<think>", "</think>"), ("<answer>", "</answer>")
        >>> P().answer_opening()
        '<think>The documents give the answer.</think>\\n<answer>'
        """
        if self.answer is None:
            raise ConfigError(f"protocol {self.name!r} has no tagged answer for its policy to open")
        if self.search_in_think:      # R1-Searcher: a search left <think> open; the answer follows </think>
            lead = self.think[0] if first else ""
            return f"{lead} {thought or READ_THOUGHT} {self.think[1]}\n{self.answer[0]}"
        think = f"{self.think[0]}{thought}{self.think[1]}\n" if thought and self.think else ""
        return f"{think}{self.answer[0]}"

    def extract_answer(self, text: str) -> str | None:
        """The final answer in a whole response, or None."""
        raise NotImplementedError

    def is_valid_format(self, response: str) -> bool:
        """Whether a whole response (actions and observations) follows the protocol."""
        raise NotImplementedError

    def count_searches(self, response: str) -> int:
        """Search actions in a whole response's text (rewards read this, whatever the protocol)."""
        raise RagrlError(f"the {self.name} protocol cannot count searches in text; pass a Trajectory")

    def has_tags(self, text: str) -> bool:
        """Whether the text holds any tag of this protocol (a protocol response, not a plain reply)."""
        return False

    def steps(self, response: str) -> list[str] | None:
        """A whole response split into its turns, where the protocol can tell them apart in text
        (SmartRAG); None where it cannot (rewards then check the response's format as a whole)."""
        return None


# Filled by the method records (ragrl.methods); `default_text_protocol` names the protocol that
# reads a bare string when a reward is given neither a Trajectory nor a protocol.
PROTOCOLS: Registry[type[TextProtocol]] = Registry("protocol")
_DEFAULT: list[str] = []


def set_default_text_protocol(name: str) -> None:
    _DEFAULT[:] = [name]


def default_text_protocol() -> str:
    if not _DEFAULT:
        PROTOCOLS.names()   # loads the method records, one of which declares the default
    if not _DEFAULT:
        raise ConfigError("no protocol is registered as the default for plain text; pass protocol=...")
    return _DEFAULT[0]


def get_protocol(name: str | TextProtocol, **kwargs) -> TextProtocol:
    """A protocol instance by name (an instance passes through unchanged, if no kwargs)."""
    if isinstance(name, TextProtocol) and not kwargs:
        return name
    cls = PROTOCOLS[name]
    try:
        return cls(**kwargs)
    except TypeError as exc:  # an option the protocol does not have
        raise ConfigError(f"protocol {name!r}: {exc}") from None


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-templated ids of `messages` with the generation prompt appended."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some versions return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
