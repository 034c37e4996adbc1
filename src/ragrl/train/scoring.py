"""The reward phase of one RL step: every episode of the step gets its reward and its metrics.

Kept apart from the trainer so that the phase reads top to bottom: what the reward needs from the
index first (the question's own ranks, for a reward that compares a search with the question),
then the reward, the recipe's rule for an episode cut by a wall-time bound, and the metrics that
the step's row and the learning curves read (EM/F1 and gold recall).
"""
from __future__ import annotations

from ragrl.errors import RagrlError
from ragrl.eval.harness import score
from ragrl.rewards.registry import query_rank_depth, reward_needs
from ragrl.rewards.search import gold_recall, query_answer_ranks, question_answer_ranks
from ragrl.rollout.trajectory import EpisodeEnd


def score_step(samples: list[dict], trajs: list, reward_fn, *, retriever, question_depth: int,
               timeout_reward: float | None) -> None:
    """Set `t.reward` and `t.metrics` on each trajectory in `trajs` (the policy's and any expert's).

    samples:        the step's questions; a trajectory finds its own by `sample_id` (a sample's
                    "id", else its position), not by group: a pipeline's agents have groups of their
                    own, and GRPO never mixes agents.
    retriever:      the step's index, asked once for the questions' own top `question_depth` when the
                    reward compares a search with the question (search_gain, `needs_question_rank`),
                    and once for the episodes' queries' top passages when it grades them at depth
                    (query_rank, as deep as its deepest tier).
    timeout_reward: the reward of an episode cut by a wall-time bound (guard.timeout_reward), or
                    None to score it as it stands.
    """
    by_id = {str(s.get("id", i)): s for i, s in enumerate(samples)}
    if reward_needs(reward_fn, "needs_question_rank"):
        if retriever is None:
            raise RagrlError("this step's reward compares a search with the question's own (search_gain), "
                             "and the setup has no index to ask")
        question_answer_ranks(samples, retriever, question_depth)
    depth = query_rank_depth(reward_fn)
    if depth:
        if retriever is None:
            raise RagrlError("this step's reward grades the episodes' own queries at depth (query_rank), "
                             "and the setup has no index to ask")
        query_answer_ranks(trajs, by_id, retriever, depth)
    for t in trajs:
        sample = by_id[t.sample_id]
        t.reward = float(reward_fn(t, sample))
        if t.stop_reason == EpisodeEnd.TIMEOUT and timeout_reward is not None:
            t.reward = timeout_reward
        score(t)
        if sample.get("gold_passage_ids"):
            t.metrics["gold_recall"] = gold_recall(t.retrieved_ids, sample["gold_passage_ids"])
