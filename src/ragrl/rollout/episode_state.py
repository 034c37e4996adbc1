"""An episode under construction: the multi-turn runner's per-episode state, and the one way an
observation is appended to it (masked: the policy did not write it)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.title_queries import QueryTrie
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory, Turn


@dataclass
class EpisodeState:
    """A trajectory under construction."""

    traj: Trajectory
    done: bool = False
    pending_queries: list[str] = field(default_factory=list)
    deadline: float | None = None      # time.monotonic() instant the episode must end by (None: no bound)
    opening: str = ""                  # text the runner wrote before the next turn (first/second/last_action)
    last_search: bool = False          # its pending search is the last one (end_after_searches)
    turn_start: int = 0                # where its latest turn's generated ids start in traj.token_ids
    turn_opening: str = ""             # the runner's text in front of that turn (its `opening`)
    closing: tuple[str, list[int]] | None = None   # the last turn's answer opening (last_action: answer)
    again: Callable[[Trajectory], tuple[str, list[int]]] | None = None   # the second turn's search opening
    title_rule: Callable[[Trajectory, int], QueryTrie | None] | None = None   # second_query: title's constraint
    copy: int = 0                      # which of its question's rollout.n episodes this is
    allowed: QueryTrie | None = None   # the next turn's constraint (its second query's titles), if any
    next_page: bool = False            # its pending search is title_fallback's: the question's next passages

    def end(self, reason: EpisodeEnd) -> None:
        """The one way an episode ends: no turn follows, and the trajectory says why."""
        self.done, self.traj.stop_reason = True, reason


def append_observation(st: EpisodeState, turn: Turn, obs: str, ids: list[int], cfg: RolloutConfig) -> None:
    """Append an observation's ids to the trajectory, masked out of every loss (the policy did not write
    them), and end the episode once its response budget is spent."""
    t = st.traj
    turn.observation = obs
    t.append_masked(ids)
    if len(t.token_ids) - t.prompt_len >= cfg.max_response_tokens:
        st.end(EpisodeEnd.MAX_TOKENS)
