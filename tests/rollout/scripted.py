"""Test helpers for the rollout loop: a scripted engine (a fake that injects exact model outputs),
a recording wrapper around a real engine, a counting wrapper around a real retriever, and the
token-level invariants every trajectory must satisfy.
"""
from __future__ import annotations

from ragrl.engines.base import Generation, SamplingParams
from ragrl.rollout.multi_turn import prompt_ids


class ScriptedEngine:
    """Plays pre-written turns, tokenised with the real tokenizer, as if a model had sampled them.

    scripts: {question: [turn, ...]}; a turn is a text, or (text, ending) with ending "eos"
    (the EOS token is appended) or "stop"/"length" (the ids as they are). A plain text ends
    with "stop" when it ends in one of the call's stop strings, else with EOS. Like a real engine,
    a turn is cut at `max_new_tokens` (stop_reason "length"). A question whose script has run
    out emits a bare EOS. Log-probs are a deterministic, plausible function of (position, id).
    """

    def __init__(self, tokenizer, protocol, scripts: dict[str, list]):
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.prompts = {q: prompt_ids(tokenizer, protocol, q) for q in scripts}
        self.scripts = scripts
        self.turns_played = {q: 0 for q in scripts}
        self.calls: list[tuple[list[list[int]], list[SamplingParams]]] = []

    def generate(self, prompts, params):
        per_prompt = list(params) if isinstance(params, list) else [params] * len(prompts)
        self.calls.append(([list(p) for p in prompts], per_prompt))
        out, seen = [], set()
        for ids, sp in zip(prompts, per_prompt):
            question = self._question_of(ids)
            turn_idx = self.turns_played[question]
            seen.add(question)
            script = self.scripts[question]
            out.append([self._play(script[turn_idx] if turn_idx < len(script) else ("", "eos"), sp)])
        for question in seen:  # the n samples of a question play the same script in lockstep
            self.turns_played[question] += 1
        return out

    def _question_of(self, ids: list[int]) -> str:
        for question, p in self.prompts.items():
            if ids[: len(p)] == p:
                return question
        raise AssertionError("the loop sent a prompt that starts with no known question's prompt")

    def _play(self, turn, sp: SamplingParams) -> Generation:
        text, ending = turn if isinstance(turn, tuple) else (turn, None)
        if ending is None:
            ending = "stop" if any(text.endswith(s) for s in sp.stop) else "eos"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if ending == "eos":
            ids.append(self.eos_id)
        stop_string = next((s for s in sp.stop if text.endswith(s)), None) if ending == "stop" else None
        if len(ids) > sp.max_new_tokens:
            ids, ending, stop_string = ids[: sp.max_new_tokens], "length", None
        logprobs = [-0.01 - ((7 * k + tok) % 23) / 10 for k, tok in enumerate(ids)]
        shown = ids[:-1] if ending == "eos" else ids
        return Generation(ids, logprobs, ending, stop_string, text=self.tokenizer.decode(shown))


class RecordingEngine:
    """A thin wrapper around a real engine that keeps every call's prompts and Generations."""

    def __init__(self, engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.calls: list[tuple[list[list[int]], list[Generation]]] = []

    def generate(self, prompts, params):
        gens = self.engine.generate(prompts, params)
        self.calls.append(([list(p) for p in prompts], [g[0] for g in gens]))
        return gens


class CountingRetriever:
    """A real retriever plus the list of query batches it was asked (one entry per call)."""

    def __init__(self, retriever):
        self.retriever = retriever
        self.calls: list[list[str]] = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return self.retriever.search(queries, k)


def spans(mask: list[int], start: int) -> list[tuple[int, int, int]]:
    """Maximal runs of equal mask values from `start`: [(value, begin, end), ...]."""
    runs, begin = [], start
    for i in range(start + 1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[begin]:
            runs.append((mask[begin], begin, i))
            begin = i
    return runs


def check_token_invariants(traj, tokenizer, eos_ids) -> None:
    """The mask-1 runs decode to the turns' actions, the mask-0 runs to their observations,
    and log-probs are 0 exactly off the mask."""
    assert len(traj.token_ids) == len(traj.action_mask) == len(traj.logprobs)
    assert traj.action_mask[: traj.prompt_len] == [0] * traj.prompt_len
    runs = spans(traj.action_mask, traj.prompt_len)
    actions = [(b, e) for v, b, e in runs if v == 1]
    observations = [(b, e) for v, b, e in runs if v == 0]
    assert len(actions) == len(traj.turns) == traj.num_turns
    assert [t.observation for t in traj.turns if t.observation] == [
        tokenizer.decode(traj.token_ids[b:e]) for b, e in observations]
    for turn, (b, e) in zip(traj.turns, actions):
        ids = traj.token_ids[b:e]
        if ids[-1] in eos_ids:  # the EOS token belongs to the action but not to its text
            ids = ids[:-1]
        assert tokenizer.decode(ids) == turn.action_text
    for m, lp in zip(traj.action_mask, traj.logprobs):
        assert (lp == 0.0) if m == 0 else (lp <= 0.0)
