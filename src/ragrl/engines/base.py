"""The generation-engine interface: token ids in, token ids + log-probs out.

Engines never see text except to check stop strings; the rollout loop keeps every
trajectory as token ids so that training sees exactly the ids that were sampled.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

StopReason = Literal["stop", "eos", "length", "timeout"]


@dataclass
class SamplingParams:
    """How to sample one prompt's continuations.

    temperature == 0 means greedy. `stop` strings end a sequence as soon as the decoded
    new text contains one; the returned tokens include the token that completed it.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    # Constrained decoding: given the tokens generated so far, the ids the next one may be (a
    # grammar, e.g. MMOA-RAG's selector). Sampling is restricted to them; the recorded log-prob
    # stays the raw temperature-1 one of the model, as PPO needs. None: unconstrained.
    allowed_tokens: Callable[[list[int]], Sequence[int]] | None = None
    # Wall-time bound: a `time.monotonic()` instant. A row still decoding at it stops with
    # stop_reason "timeout" and keeps the tokens (and log-probs) generated so far, so one slow row
    # cannot hold a batch past its caller's budget; a row whose deadline has already passed when
    # generate starts (or before it gets a batch slot) returns with no new token, or at most one.
    # Engines check it between decode steps (StaticEngine: every `check_every` tokens), so a row may
    # overrun it by one step or chunk. None: no bound. The vLLM engine refuses it.
    deadline: float | None = None


@dataclass
class Generation:
    """One sampled continuation.

    token_ids: the new tokens, [T].
    logprobs: log p(token_t | prefix) under the *sampling* distribution's model logits
        at temperature 1 (before top-p truncation), [T] — what PPO needs as old log-probs.
    stop_reason: "stop" (a stop string matched; `stop_string` says which), "eos", "length", or
        "timeout" (cut at `SamplingParams.deadline`: the tokens so far, possibly none).
    """

    token_ids: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    stop_string: str | None = None
    text: str = ""


@dataclass
class NextTurn:
    """What an episode does after a turn, told to an engine that runs whole episodes
    (`StaticEngine.run_turns`): append `observation` (token ids; may be empty) after the turn's
    tokens and decode the next turn with `params` (n must be 1)."""

    observation: list[int]
    params: SamplingParams


# A turn-end callback: the turns that ended since the last call, as (episode index, Generation),
# in; for each, the episode's NextTurn, or None when the episode is over, out.
TurnEnds = Callable[[list[tuple[int, Generation]]], list["NextTurn | None"]]


class Engine(Protocol):
    """Batched generation over token-id prompts."""

    tokenizer: object

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[Generation]]:
        """For each prompt (with its own params, or shared ones), return `n` Generations."""
        ...
