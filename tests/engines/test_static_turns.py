"""StaticEngine.run_turns: whole episodes, each next turn continuing in its slot at once. Exact
against a plain forward and against turn-by-turn `generate`; ragged turns do not wait for each
other; every misuse is refused, not absorbed. Real tiny model (float32, CPU, eager step)."""
import time

import pytest
import torch

from ragrl.engines.base import NextTurn, SamplingParams
from ragrl.engines.static import StaticEngine
from ragrl.errors import ConfigError, RagrlError
from ragrl.models.lm_weights import load_policy

TEXTS = ["Who wrote Hamlet?", "What is the capital of France and why is it famous?", "Name a colour.",
         "How far away is the moon from the earth, roughly?"]
OBS = [[1000 + 7 * k + j for j in range(3 + 2 * k)] for k in range(4)]   # a different observation per episode


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_policy(str(tiny_model_dir))


@pytest.fixture(scope="module")
def prompts(tiny):
    tok = tiny[1]
    return [tok(t)["input_ids"] for t in TEXTS]


def plain_logprobs(model, sequence: list[int], start: int) -> list[float]:
    """log p(sequence[t] | sequence[:t]) for t >= start, from one plain forward pass."""
    with torch.inference_mode():
        logits = model(torch.tensor([sequence])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [lp[t - 1, sequence[t]].item() for t in range(start, len(sequence))]


class Script:
    """A turn-end callback: episode e runs `turns` turns of budget `budgets[e][t]`, with OBS[e] between
    them. Records every call's (episode, turn, tokens) and the episodes' full sequences."""

    def __init__(self, prompts, budgets, turns=2, temperature=1.0, seed=5):
        self.budgets, self.turns, self.temperature, self.seed = budgets, turns, temperature, seed
        self.sequences = [list(p) for p in prompts]
        self.turn_of = [0] * len(prompts)
        self.events: list[tuple[int, int, list[int], str]] = []
        self.action_spans: list[list[tuple[int, int]]] = [[] for _ in prompts]
        self.logprobs: list[list[float]] = [[] for _ in prompts]
        self.calls = 0

    def params(self, e: int, t: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.budgets[e][t], temperature=self.temperature, seed=self.seed + t)

    def __call__(self, ended):
        self.calls += 1
        answers = []
        for e, g in ended:
            t = self.turn_of[e]
            self.events.append((e, t, list(g.token_ids), g.stop_reason))
            self.action_spans[e].append((len(self.sequences[e]), len(self.sequences[e]) + len(g.token_ids)))
            self.sequences[e] += g.token_ids
            self.logprobs[e] += g.logprobs
            self.turn_of[e] = t + 1
            if t + 1 == self.turns:
                answers.append(None)
            else:
                self.sequences[e] += OBS[e]
                answers.append(NextTurn(OBS[e], self.params(e, t + 1)))
        return answers


def test_next_turns_in_slot_are_exact_and_do_not_wait_for_slower_rows(tiny, prompts):
    """4 ragged episodes through 2 slots, sampled: every log-prob equals a plain forward over the
    whole episode (prompt, turn 1, observation, turn 2), only new tokens are prefilled, and an
    episode with short turns finishes both before a long first turn elsewhere ends."""
    model, tok = tiny
    budgets = [[2, 3], [30, 4], [3, 2], [5, 6]]
    script = Script(prompts, budgets)
    engine = StaticEngine(model, tok, max_batch_size=2, check_every=4, eos_token_ids={-1})
    engine.run_turns(prompts, [script.params(e, 0) for e in range(4)], script, max_episode_tokens=60)
    assert [(e, t) for e, t, _, _ in script.events if e == 0] == [(0, 0), (0, 1)]
    order = [(e, t) for e, t, _, _ in script.events]
    assert order.index((0, 1)) < order.index((1, 0))          # episode 0 did not wait for episode 1's turn
    assert all(len(ids) == budgets[e][t] and reason == "length" for e, t, ids, reason in script.events)
    for e in range(4):
        start = len(prompts[e])
        want = plain_logprobs(model, script.sequences[e], start)
        got = iter(script.logprobs[e])
        for a, b in script.action_spans[e]:
            for k in range(a, b):
                assert abs(next(got) - want[k - start]) < 1e-4
    # Prompts, then per next turn its observation and the one sampled token never fed: nothing twice.
    assert engine.prefill_tokens == sum(map(len, prompts)) + sum(len(o) + 1 for o in OBS)


def test_greedy_episodes_equal_turn_by_turn_generate(tiny, prompts):
    model, tok = tiny
    budgets = [[6, 5], [9, 3], [4, 8], [7, 7]]
    script = Script(prompts, budgets, temperature=0.0)
    StaticEngine(model, tok, max_batch_size=2, check_every=3).run_turns(
        prompts, [script.params(e, 0) for e in range(4)], script, max_episode_tokens=40)
    engine = StaticEngine(model, tok, max_batch_size=4)
    with engine.prefix_caching():
        first = engine.generate(prompts, [script.params(e, 0) for e in range(4)])
        second = engine.generate([p + g[0].token_ids + o for p, g, o in zip(prompts, first, OBS)],
                                 [script.params(e, 1) for e in range(4)])
    by_turn = {(e, t): ids for e, t, ids, _ in script.events}
    assert [by_turn[(e, 0)] for e in range(4)] == [g[0].token_ids for g in first]
    assert [by_turn[(e, 1)] for e in range(4)] == [g[0].token_ids for g in second]


def test_a_row_past_its_deadline_is_reported_with_no_tokens(tiny, prompts):
    model, tok = tiny
    seen = {}
    past = SamplingParams(max_new_tokens=5, temperature=0, deadline=time.monotonic() - 1)
    StaticEngine(model, tok).run_turns(
        prompts[:2], [past, SamplingParams(max_new_tokens=3, temperature=0)],
        lambda ended: [seen.__setitem__(e, (g.stop_reason, len(g.token_ids))) for e, g in ended],   # all None: done
        max_episode_tokens=8)
    assert seen == {0: ("timeout", 0), 1: ("length", 3)}


def test_misuse_is_refused_with_the_reason(tiny, prompts):
    model, tok = tiny
    engine = StaticEngine(model, tok, max_batch_size=2)
    greedy = SamplingParams(max_new_tokens=4, temperature=0)
    with pytest.raises(ConfigError, match="n = 1"):
        engine.run_turns(prompts[:1], [SamplingParams(n=2)], lambda ended: [None] * len(ended), max_episode_tokens=8)
    with pytest.raises(RagrlError, match="answered 0 times for 2 turns"):
        engine.run_turns(prompts[:2], [greedy, greedy], lambda ended: [], max_episode_tokens=8)
    with pytest.raises(RagrlError, match="must answer a NextTurn or None"):
        engine.run_turns(prompts[:1], [greedy], lambda ended: ["more"], max_episode_tokens=8)
    with pytest.raises(RagrlError, match="KV columns, past the"):    # 300 observation tokens, 8 reserved
        engine.run_turns(prompts[:1], [greedy], lambda ended: [NextTurn([5] * 300, greedy)], max_episode_tokens=8)
    with pytest.raises(ConfigError, match="keep temperature and top_p alike"):
        engine.run_turns(prompts[:1], [greedy], lambda ended: [NextTurn([5], SamplingParams(max_new_tokens=2))],
                         max_episode_tokens=8)
