"""Trajectory: everything one episode produced, as token ids plus the record of each turn.

The algorithms only see `token_ids`, `action_mask`, `logprobs`, rewards and group ids;
the per-turn record is for rewards, reports and debugging.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from ragrl.retrieval.base import Hit
from ragrl.retrieval.stochastic import RetrievalAction


@dataclass
class Turn:
    """One policy action and the observation that answered it."""

    action_text: str                      # what the policy generated this turn (decoded)
    # "search" | "answer" | "invalid" | "think" | "truncated" (cut at a wall-time bound, not parsed)
    kind: str
    queries: list[str] = field(default_factory=list)
    passage_ids: list[list[str]] = field(default_factory=list)  # per query, the retrieved ids
    passage_titles: list[list[str]] = field(default_factory=list)  # per query, their titles
    # per query, each passage's "title text" as the index holds it (before an observation's word and
    # token cuts): what the search-outcome rewards and answer@shown read
    passage_texts: list[list[str]] = field(default_factory=list)
    observation: str = ""                 # text appended after the action (empty at the end)
    error: str | None = None              # why the action was invalid, if it was
    # the runner wrote this action, not the policy (rollout.first_action: question): rewards that
    # grade the policy's own queries (query_rank) leave it out
    by_runner: bool = False


class EpisodeEnd(StrEnum):
    """Every way an episode ends: the one vocabulary of `Trajectory.stop_reason`."""

    ANSWER = "answer"              # the policy answered
    MAX_TURNS = "max_turns"        # rollout.max_turns used up without an answer
    MAX_TOKENS = "max_tokens"      # rollout.max_response_tokens reached
    NO_ANSWER = "no_answer"        # the model closed its turn (EOS) without an action
    FORMAT_ERROR = "format_error"  # an unparseable turn, where the protocol ends the episode on one
    TIMEOUT = "timeout"            # cut at rollout.max_episode_s / max_rollout_s: truncated, no answer
    RETRIEVED = "retrieved"        # its last search was served: retrieval-only (HARR with no generator), or rollout.end_after_searches
    UNUSED = "unused"              # rollout.title_group: every, no candidate title left for it: dropped from the rollout
    EOS = "eos"                    # single-generation agents (MMOA-RAG's): the engine's own stop reason
    STOP = "stop"
    LENGTH = "length"


@dataclass
class Trajectory:
    """One episode of one agent on one question.

    token_ids: prompt + every action + every observation, exactly as the model saw them.
    action_mask: 1 where the policy generated the token, 0 on prompt/observation tokens.
    logprobs: sampling log-prob of each token (0.0 where action_mask is 0).
    prompt_len: number of leading prompt tokens.
    group: id shared by the n samples of one question (GRPO/RLOO groups).
    agent: which agent acted (MMOA-RAG has several; single-agent methods use "policy").
    retrievals: the sampled retrieval actions (HARR: the retriever is the policy), in order;
        empty when retrieval was deterministic.
    """

    sample_id: str
    question: str
    golds: list[str]
    token_ids: list[int]
    action_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    group: int = 0
    agent: str = "policy"
    turns: list[Turn] = field(default_factory=list)
    retrievals: list[RetrievalAction] = field(default_factory=list)
    answer: str | None = None
    num_searches: int = 0
    num_turns: int = 0
    format_errors: int = 0
    # How the episode ended (an EpisodeEnd; "" while it runs). A StrEnum: it equals and serialises
    # as its string, so trajectories written before it existed read back the same.
    stop_reason: str = ""
    reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)

    def append_masked(self, ids: list[int]) -> None:
        """Append ids the policy did not write (an observation, the runner's own text, the start's
        answer): out of every loss, with no log-prob of the policy's."""
        self.token_ids += ids
        self.action_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    @property
    def response_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)

    @property
    def retrieved_ids(self) -> list[str]:
        return [pid for t in self.turns for ids in t.passage_ids for pid in ids]

    @property
    def policy_queries(self) -> list[str]:
        """Every query the policy's own searches sent, in order: a search the runner wrote
        (`Turn.by_runner`) is left out, so what grades the policy's queries never reads it."""
        return [q for t in self.turns if t.kind == "search" and not t.by_runner for q in t.queries]

    def _shown(self) -> list[tuple[str, str, str]]:
        """(id, title, "title text") of every distinct passage the episode's searches retrieved, in
        the order they came (search by search, query by query, rank by rank); "" where none was recorded."""
        seen: dict[str, tuple[str, str, str]] = {}
        for turn in self.turns:
            for i, ids in enumerate(turn.passage_ids):
                titles = turn.passage_titles[i] if i < len(turn.passage_titles) else []
                texts = turn.passage_texts[i] if i < len(turn.passage_texts) else []
                for j, pid in enumerate(ids):
                    if pid not in seen:
                        seen[pid] = (pid, titles[j] if j < len(titles) else "", texts[j] if j < len(texts) else "")
        return list(seen.values())

    def shown_passages(self) -> list[tuple[str, str]]:
        """(id, "title text") of every distinct passage the episode's searches retrieved, in the order
        they came (search by search, query by query, rank by rank); text "" where none was recorded."""
        return [(pid, full) for pid, _, full in self._shown()]

    def shown_hits(self) -> list[Hit]:
        """The same passages as `shown_passages`, as hits: each title, and its text without the title
        in front (as the index holds it; what a reader is shown)."""
        return [Hit(id=pid, title=title, score=0.0,
                    text=full[len(title):].strip() if title and full.startswith(title) else full)
                for pid, title, full in self._shown()]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        d = dict(d)
        d["turns"] = [Turn(**t) for t in d.get("turns", [])]
        d["retrievals"] = [RetrievalAction(**a) for a in d.get("retrievals", [])]
        return cls(**d)
