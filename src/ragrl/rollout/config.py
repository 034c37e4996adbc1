"""The rollout settings (the `rollout:` section of a recipe), which of them work together, and which of
them an evaluated result depends on. Every runner and evaluation reads them; `multi_turn` runs the
episodes they describe."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ragrl.errors import ConfigError
from ragrl.yaml_config import setting


@dataclass
class RolloutConfig:
    """Budgets and sampling for episodes (every limit is per trajectory)."""

    max_turns: int = setting(4, help="Policy turns per episode, the answer turn included.")
    max_turn_tokens: int = setting(128, help="New tokens the policy may generate in one turn.")
    max_response_tokens: int = setting(768, help=(
        "Tokens of an episode after its prompt (actions and observations together); a turn's budget "
        "is cut to what is left."))
    max_obs_tokens: int = setting(192, help=(
        "Tokens of one observation, tags included (passages are shortened to fit, never the tags)."))
    passage_words: int = setting(40, help=(
        "Each retrieved passage is cut to this many words before the observation's token budget."))
    max_queries_per_call: int = setting(3, help=(
        "Queries honoured from one search action (a protocol that sends several at once); the rest "
        "are dropped."))
    first_action: Literal["free", "search", "question"] = setting("free", help=(
        "free: the policy chooses its first action. search: every episode's first turn is a search "
        "(the runner writes the protocol's search opening, its thought and query tag, and the policy "
        "writes the query), in training and evaluation alike: a small policy that answers at once, or "
        "learns to, never sees what a search finds. question: the runner writes and serves the whole "
        "first search, with the question itself as its query (s3's shape: the policy starts from what "
        "naive RAG retrieves and searches for what it missed); it counts as the episode's first turn "
        "and search, and none of it is in any loss. Needs max_turns >= 2 and end_after_searches unset "
        "or >= 2, so the policy has a turn."))
    second_action: Literal["free", "search"] = setting("free", help=(
        "free: the policy chooses the action of its second turn. search: an episode whose first turn "
        "searched searches again at its second (the runner writes the protocol's search opening with "
        "a later search's thought, and the policy writes the query), in training and evaluation "
        "alike: every episode then names a second query, so a reward on what the searches found can "
        "compare them. Needs first_action: search or question, and max_turns >= 3 with last_action: answer."))
    second_query: Literal["free", "title", "question_title"] = setting("free", help=(
        "free: the policy writes its second search's query as it likes. title: that query is one of the "
        "corpus's titles that the question or the first search's passages name, less the titles that "
        "search showed (constrained decoding over them, GENRE-style; free where there is none), in "
        "training and evaluation alike: the policy chooses which title to search, and a group's samples "
        "differ in what they search for. question_title: the policy chooses the title as under title, "
        "and the runner searches the question followed by it (a title that misses then costs little: "
        "experiments/README.md, the count after candidate W). Needs second_action: search, an in-process "
        "index (it lists the titles) and the hf engine."))
    query_prefix: Literal["none", "question"] = setting("none", help=(
        "none: a search sends each query the policy wrote as it is. question: the runner searches the "
        "question followed by each query the policy wrote (query expansion, as DeepRetrieval's and "
        "query2doc's rewriters keep the question's words), in training and evaluation alike: a query "
        "adds words for BM25 to match and cannot drop the question's, whose own search is the measure "
        "the search gain compares with. The turn records each query as searched; its action text keeps "
        "what the policy wrote. Needs a multi-turn search action, second_query: free (question_title "
        "prefixes its title already), sft.steps: 0 and no expert episodes (both write episodes whose "
        "searches are their queries as written)."))
    title_group: Literal["sample", "every"] = setting("sample", help=(
        "Training only, under second_query: title or question_title. sample: each of a question's n "
        "episodes samples its title. every: the question's episodes take its candidate titles one each "
        "(the first n in sorted order; a question with none writes one free query), and episodes left "
        "over are dropped from the rollout: the group enumerates the choice instead of sampling it, so "
        "it is flat only where every title scores the same. Needs algo.estimator: enumerated, which "
        "weighs each title by the policy's probability of it (the exact policy gradient of the choice), "
        "and n at least the most candidates a question has (the step's rollout/title_candidates_cut says "
        "how often a question had more)."))
    title_fallback: Literal["none", "question"] = setting("none", help=(
        "Under second_query: title or question_title. none: the second query is one of the titles. "
        "question: one more candidate beside them, the question itself, which the runner serves as the "
        "question's next passages (its best rows past those the first search showed), in training and "
        "evaluation alike: the policy may keep reading naive RAG's own list instead of searching a title, "
        "so a title is worth choosing only where it finds more than that list would (the fallback's "
        "search gain at equal passages is 0 by construction). It is the first candidate, so "
        "title_group: every never cuts it, and a question with no title searches it rather than "
        "writing a free query."))
    title_notes: Literal["none", "first_sentence"] = setting("none", help=(
        "Under second_query: title or question_title. none: the policy chooses among the titles by their "
        "names alone. first_sentence: the runner writes the candidates into the second search's thought, "
        "one a line, each with the first sentence of its first passage (at most 16 words; at most 12 "
        "titles, the first in sorted order), out of every loss, in training and evaluation alike: the "
        "chooser reads what each title's page is before it chooses. Needs an in-process index (it reads "
        "the corpus's texts) and, for an LM run, sft.steps: 0 (the SFT episodes write the thought without "
        "the notes)."))
    last_action: Literal["free", "answer"] = setting("free", help=(
        "free: the policy chooses the action of its last turn (rollout.max_turns). answer: an episode "
        "that reaches its last turn answers there: the runner writes the protocol's answer opening (a "
        "thought and the answer tag, out of every loss) and the policy, or its start under "
        "answer_by: start, writes the answer, in training and evaluation alike: s3's shape, where "
        "every episode ends in an answer once its searches are spent. Needs max_turns >= 2 and a "
        "protocol with tagged answers."))
    max_searches: int | None = setting(None, help=(
        "Retrieval quota per episode (SmartRAG): a search past it is a format error. null: no quota."))
    end_after_searches: int | None = setting(None, help=(
        "Training only: an episode ends once this many of its searches have been served (stop "
        "reason `retrieved`; the last search's passages are recorded, not shown), so a reward on what "
        "the searches found trains the query writer without the turns after them (DeepRetrieval's "
        "setup, R1-Searcher's stage 1). Evaluation always runs whole episodes. null: off."))
    answer_by: Literal["policy", "start", "base", "reader"] = setting("policy", help=(
        "Who writes an answer's text after the protocol's answer tag. policy: the policy. start: the "
        "weights the run started from (model.reference_adapter or else model.init_adapter, kept frozen "
        "as the KL reference; the base model without one), greedily, in training and evaluation alike: s3's frozen generator, so "
        "training the searcher cannot move the reader. base: the base model (model.name, every LoRA "
        "adapter off), greedily, for the run and its start alike: a reader no warm start taught to "
        "write its queries back as answers. reader: the base model, adapters off, answers from naive "
        "RAG's own prompt over the episode's distinct shown passages (their snippets, naive RAG's "
        "answer budget), not by continuing the transcript: s3's generator, which cannot make a format "
        "error. Those tokens are masked out of every loss. Needs a LoRA policy and the hf engine."))
    topk: int = setting(3, help="Passages retrieved per query.")
    temperature: float = setting(1.0, help=(
        "Sampling temperature of the policy's training rollouts (evaluation decodes greedily). 0: greedy."))
    top_p: float = setting(1.0, help="Nucleus sampling: tokens outside the top-p mass are never drawn. 1: off.")
    n: int = setting(1, help=(
        "Samples per question in training: a question's group for the group estimators (grpo, "
        "rloo, ...), which need n >= 2. Evaluation uses 1."))
    seed: int = setting(0, help=(
        "Base seed of the rollout's sampling (each turn's seed derives from it). Training replaces "
        "it every step with one derived from the run's seed, the step and the rank; evaluation with "
        "its own seed."))
    # The engine cuts a turn at the bound, so one slow row does not hold the others.
    max_episode_s: float | None = setting(None, help=(
        "Wall-time bound of one episode in seconds from its start: past it the episode ends as "
        "truncated (stop_reason timeout; scored per guard.timeout_reward). Training only. null: none."))
    max_rollout_s: float | None = setting(None, help=(
        "Wall-time bound of a whole rollout call in seconds: episodes still running then end as "
        "truncated (stop_reason timeout). Training only. null: none."))
    # Greedy episodes are the same either way; sampled ones draw from other seeds (a turn's seed is
    # per episode, not per position in the batch of still-active episodes).
    turns_in_slot: bool = setting(True, help=(
        "With an engine that runs whole episodes (static): an episode's next turn starts in its slot "
        "as soon as its own turn and retrieval are done. false: every episode's turn t waits for the "
        "whole batch's turn t, then all retrieve in one call."))


# Rollout settings that only shape how training episodes are scheduled, with the value evaluation
# gives each (no wall-time cut: an evaluated result must not depend on how busy the machine was;
# greedy episodes are the same in or out of their slots), so they never change an evaluated result
# (nor belong in the key of a cached one). A method's own training-only knobs are set to their
# evaluation values by its `Method.evaluation_settings`.
TRAINING_ONLY = {"max_episode_s": None, "max_rollout_s": None, "turns_in_slot": True,
                 "end_after_searches": None, "title_group": "sample"}
# Settings added after evaluations were first cached, with the value that leaves episodes as they were:
# they join a cache key only when set, so entries written before they existed stay valid.
KEYED_WHEN_SET = {"first_action": "free", "second_action": "free", "last_action": "free", "answer_by": "policy",
                  "second_query": "free", "title_notes": "none", "title_fallback": "none", "query_prefix": "none"}


def evaluation_key(rollout: RolloutConfig) -> dict:
    """The rollout settings an evaluated result depends on, for a cache key: the training-only ones
    left out, and KEYED_WHEN_SET's only where set.

    >>> sorted(set(RolloutConfig().__dict__) - set(evaluation_key(RolloutConfig())))  # doctest: +NORMALIZE_WHITESPACE
    ['answer_by', 'end_after_searches', 'first_action', 'last_action', 'max_episode_s', 'max_rollout_s',
     'query_prefix', 'second_action', 'second_query', 'title_fallback', 'title_group', 'title_notes',
     'turns_in_slot']
    >>> evaluation_key(RolloutConfig(answer_by="start"))["answer_by"]
    'start'
    """
    return {k: v for k, v in rollout.__dict__.items()
            if k not in TRAINING_ONLY and (k not in KEYED_WHEN_SET or KEYED_WHEN_SET[k] != v)}


def check_forced_turns(cfg: RolloutConfig) -> None:
    """`rollout.last_action: answer` needs a turn before the last one to search in, `first_action:
    question` a turn left for the policy, and `second_action: search` a forced first search and a
    second turn that is not the forced answer."""
    check_title_group(cfg)
    if cfg.last_action == "answer" and cfg.max_turns < 2:
        raise ConfigError(f"rollout.last_action=answer makes the last of rollout.max_turns={cfg.max_turns} "
                          "turns an answer, which leaves no turn to search: set max_turns >= 2")
    if cfg.first_action == "question":
        if cfg.max_turns < 2:
            raise ConfigError(f"rollout.first_action=question makes the first of rollout.max_turns={cfg.max_turns} "
                              "turns the runner's own search, which leaves the policy none: set max_turns >= 2")
        if cfg.end_after_searches is not None and cfg.end_after_searches < 2:
            raise ConfigError(f"rollout.end_after_searches={cfg.end_after_searches} ends every episode at the "
                              "runner's own search (rollout.first_action=question), before the policy acts: "
                              "set it >= 2, or null")
    if cfg.second_action != "search":
        if cfg.second_query != "free":
            raise ConfigError(f"rollout.second_query={cfg.second_query} constrains the query of the second "
                              "search that rollout.second_action=search makes: set second_action: search")
        return
    if cfg.first_action == "free":
        raise ConfigError("rollout.second_action=search searches again after a first search, which "
                          "rollout.first_action=free does not make sure of: set rollout.first_action=search")
    turns = 3 if cfg.last_action == "answer" else 2
    if cfg.max_turns < turns:
        raise ConfigError(f"rollout.second_action=search needs a second turn to search in and rollout.max_turns="
                          f"{cfg.max_turns} leaves none{' before the forced answer' if turns == 3 else ''}: set "
                          f"max_turns >= {turns}")


def check_title_group(cfg: RolloutConfig) -> None:
    """`rollout.title_group: every` hands out the titles `second_query` chooses among,
    `rollout.title_notes` notes them and `rollout.title_fallback` adds one: each refused without one."""
    if cfg.title_notes != "none" and cfg.second_query == "free":
        raise ConfigError(f"rollout.title_notes={cfg.title_notes} notes the candidate titles that "
                          "rollout.second_query=title (or question_title) chooses among; this run's second "
                          "query is free: set second_query, or title_notes: none")
    if cfg.title_fallback != "none" and cfg.second_query == "free":
        raise ConfigError(f"rollout.title_fallback={cfg.title_fallback} adds a candidate to the titles that "
                          "rollout.second_query=title (or question_title) chooses among; this run's second "
                          "query is free: set second_query, or title_fallback: none")
    if cfg.title_group == "every" and cfg.second_query == "free":
        raise ConfigError("rollout.title_group=every gives each episode of a group one of the titles that "
                          "rollout.second_query=title (or question_title) chooses among; this run's second "
                          "query is free: set second_query, or title_group: sample")
