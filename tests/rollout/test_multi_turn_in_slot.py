"""run_episodes with an engine that runs whole episodes (StaticEngine.run_turns, rollout.turns_in_slot):
the same trajectories as the turn-by-turn loop where they must be (greedy, real SmolLM2, real BM25
retrievals), exact log-probs and seeds independent of the slots when sampled (tiny model), and wall-time
bounds honoured between turns. The fault injected: a retrieval that takes the rest of the rollout's time."""
import time
from dataclasses import replace

import pytest
import torch

from ragrl.datasets import load_questions
from ragrl.engines.hf import HFEngine
from ragrl.engines.static import StaticEngine
from ragrl.models.lm_weights import load_policy
from ragrl.policy.logprobs import action_logprobs
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import run_episodes
from ragrl.rollout.protocol import NEXT_SEARCH_THOUGHT, get_protocol
from tests.rollout.scripted import CountingRetriever, check_token_invariants, spans
from tests.rollout.test_multi_turn import NudgedSearchR1

GREEDY = RolloutConfig(max_turns=3, max_turn_tokens=20, max_response_tokens=110, max_obs_tokens=64, passage_words=20,
                       topk=2, temperature=0.0, n=2, seed=11)


@pytest.fixture(scope="module")
def samples():
    return load_questions("demo-eval", limit=4)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_policy(str(tiny_model_dir))


def no_generate(*_):
    raise AssertionError("the in-slot path must not fall back to turn-by-turn generate")


def summary(trajs):
    return [(t.token_ids, t.action_mask, t.stop_reason, t.answer, [(u.kind, u.queries, u.passage_ids) for u in t.turns])
            for t in trajs]


def test_greedy_episodes_in_slot_equal_the_turn_by_turn_loop(smollm2_policy, index, samples):
    """Real SmolLM2 nudged to search: 8 episodes of up to 3 turns, real BM25 observations, 4 slots."""
    model, tok = smollm2_policy
    reference, _ = run_episodes(HFEngine(model, tok), NudgedSearchR1(), index, samples, GREEDY)
    engine = StaticEngine(model, tok, max_batch_size=4, check_every=4)
    engine.generate = no_generate
    retriever = CountingRetriever(index)
    trajs, stats = run_episodes(engine, NudgedSearchR1(), retriever, samples, GREEDY)
    assert summary(trajs) == summary(reference)
    assert sum(t.num_searches for t in trajs) >= 4 and len(retriever.calls) >= 1
    assert max(t.num_turns for t in trajs) == 3 and stats["gen_tokens"] == sum(t.num_action_tokens for t in trajs)
    for t in trajs:
        check_token_invariants(t, tok, engine.eos_token_ids)

    # Episodes that end once their first search is served (rollout.end_after_searches) end the same in slots.
    first_search = replace(GREEDY, end_after_searches=1)
    reference, _ = run_episodes(HFEngine(model, tok), NudgedSearchR1(), index, samples, first_search)
    trajs, _ = run_episodes(engine, NudgedSearchR1(), index, samples, first_search)
    assert summary(trajs) == summary(reference)
    assert {t.stop_reason for t in trajs if t.num_searches} == {"retrieved"}
    assert all(t.num_searches <= 1 for t in trajs) and any(t.num_searches for t in trajs)


def test_sampled_episodes_in_slot_score_exactly_and_do_not_depend_on_the_slots(tiny, samples):
    """The tiny model writes no tags: every turn gets a feedback observation and a next turn, in its slot."""
    model, tok = tiny
    protocol = get_protocol("search_r1")
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=10, max_response_tokens=90, temperature=1.0, n=2, seed=4)
    runs = []
    for slots, every in ((2, 3), (8, 8)):
        engine = StaticEngine(model, tok, max_batch_size=slots, check_every=every)
        engine.generate = no_generate
        runs.append(run_episodes(engine, protocol, None, samples, cfg)[0])
    trajs = runs[0]
    assert summary(trajs) == summary(runs[1])
    assert sum(t.num_turns for t in trajs) > len(trajs) and len({tuple(t.token_ids) for t in trajs}) == len(trajs)
    width = max(len(t.token_ids) for t in trajs)
    ids, attention, actions, sampled = (torch.zeros(len(trajs), width) for _ in range(4))
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        ids[i, :n], attention[i, :n] = torch.tensor(t.token_ids, dtype=torch.float), 1
        actions[i, :n], sampled[i, :n] = torch.tensor(t.action_mask, dtype=torch.float), torch.tensor(t.logprobs)
        check_token_invariants(t, tok, StaticEngine(model, tok).eos_token_ids)
    with torch.no_grad():
        rescored, _ = action_logprobs(model, ids.long(), attention.long(), actions.long())
    on = actions.bool()
    torch.testing.assert_close(rescored[on], sampled[on], atol=1e-4, rtol=0)
    # turns_in_slot: false goes turn by turn through generate; turn 1 draws from the same seeds
    engine = StaticEngine(model, tok, max_batch_size=2, check_every=3)
    engine.run_turns = no_generate
    loop, _ = run_episodes(engine, protocol, None, samples, replace(cfg, turns_in_slot=False))
    assert [t.turns[0].action_text for t in loop] == [t.turns[0].action_text for t in trajs]


class SleepyRetriever:
    """The real index, but its first search call first sleeps `seconds` (a retrieval server that stalls)."""

    def __init__(self, inner, seconds: float):
        self.inner, self.seconds, self.calls = inner, seconds, 0

    def search(self, queries, k):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.seconds)
        return self.inner.search(queries, k)


def test_an_episode_past_its_bound_after_retrieval_gets_no_next_turn(smollm2_policy, index, samples):
    """max_rollout_s passes inside the first retrieval: the episodes that searched keep their
    observation and end "timeout" with one turn; none is handed back to the engine."""
    model, tok = smollm2_policy
    engine = StaticEngine(model, tok, max_batch_size=8, check_every=4)
    engine.generate = no_generate
    bound = 8.0
    retriever = SleepyRetriever(index, bound)
    trajs, stats = run_episodes(engine, NudgedSearchR1(), retriever, samples, replace(GREEDY, max_rollout_s=bound))
    searched = [t for t in trajs if t.num_searches]
    assert searched and stats["timeouts"] == sum(t.stop_reason == "timeout" for t in trajs) >= len(searched)
    for t in searched:
        assert t.stop_reason == "timeout" and t.num_turns == 1 and t.turns[0].observation
        assert t.answer is None
        check_token_invariants(t, tok, engine.eos_token_ids)


def test_a_forced_last_answer_opens_the_last_turn_alike_in_slot_and_turn_by_turn(smollm2_policy, index, samples):
    """`rollout.last_action: answer`: an episode that reaches its last turn finds the protocol's answer
    opening written in front of it (masked: the runner wrote it), and the turn parses from there."""
    model, tok = smollm2_policy
    cfg = replace(GREEDY, last_action="answer")
    protocol = NudgedSearchR1()
    reference, _ = run_episodes(HFEngine(model, tok), protocol, index, samples, cfg)
    engine = StaticEngine(model, tok, max_batch_size=4, check_every=4)
    engine.generate = no_generate
    trajs, _ = run_episodes(engine, protocol, index, samples, cfg)
    assert summary(trajs) == summary(reference)
    opening = protocol.answer_opening()
    ids = tok.encode(opening, add_special_tokens=False)
    last = [t for t in trajs if t.num_turns == 3]
    assert last, "no episode reached its last turn"
    for t in last:
        assert t.turns[-1].action_text.startswith(opening)
        assert _last_masked_run(t)[-len(ids):] == ids    # the opening's ids, masked, after the observation
        # the policy's own ids in that turn are the rest of its text (the EOS is no text)
        *_, (value, b, e) = spans(t.action_mask, t.prompt_len)
        own = [i for i in t.token_ids[b:e] if i not in engine.eos_token_ids]
        assert value == 1 and opening + tok.decode(own) == t.turns[-1].action_text
    free, _ = run_episodes(HFEngine(model, tok), protocol, index, samples, GREEDY)
    assert not any(t.turns[-1].action_text.startswith(opening) for t in free if t.num_turns == 3)


def test_a_forced_second_search_opens_the_second_turn_alike_in_slot_and_turn_by_turn(smollm2_policy, index,
                                                                                     samples):
    """`rollout.second_action: search`: an episode whose first turn searched finds a later search's
    opening written in front of its second turn (masked: the runner wrote it), so that turn is a search
    whose query the policy writes; with the last turn a forced answer, every episode searches twice."""
    model, tok = smollm2_policy
    protocol = get_protocol("search_r1")   # not nudged: left free, SmolLM2 rarely searches twice
    cfg = replace(GREEDY, first_action="search", second_action="search", last_action="answer", max_turns=3,
                  max_response_tokens=200)
    reference, _ = run_episodes(HFEngine(model, tok), protocol, index, samples, cfg)
    engine = StaticEngine(model, tok, max_batch_size=4, check_every=4)
    engine.generate = no_generate
    trajs, _ = run_episodes(engine, protocol, index, samples, cfg)
    assert summary(trajs) == summary(reference)
    opening = protocol.search_opening(NEXT_SEARCH_THOUGHT, first=False)
    ids = tok.encode(opening, add_special_tokens=False)
    second = [t for t in trajs if t.num_turns >= 2 and t.turns[0].kind == "search"]
    assert second, "no episode searched and reached its second turn"
    # a first turn that did not search (its query unclosed within the turn) leaves the second one free
    assert not any(t.turns[1].action_text.startswith(opening) for t in trajs
                   if t.num_turns >= 2 and t.turns[0].kind != "search")
    for t in second:
        turn = t.turns[1]
        assert turn.action_text.startswith(opening)
        # the opening's ids sit masked right before the policy's second turn, after the first observation
        (_, b, e) = [run for run in spans(t.action_mask, t.prompt_len) if run[0] == 1][1]
        assert t.token_ids[b - len(ids):b] == ids and t.action_mask[b - len(ids):b] == [0] * len(ids)
        own = [i for i in t.token_ids[b:e] if i not in engine.eos_token_ids]   # the policy's ids: the query on
        assert opening + tok.decode(own) == turn.action_text
    assert all(t.num_searches == 2 for t in trajs if t.turns[1].kind == "search")
    assert any(t.num_searches == 2 for t in trajs)
    free, _ = run_episodes(HFEngine(model, tok), protocol, index, samples, replace(cfg, second_action="free"))
    assert not any(t.num_turns >= 2 and t.turns[1].action_text.startswith(opening) for t in free)


def test_the_runner_searches_the_question_first_alike_in_slot_and_turn_by_turn(smollm2_policy, index, samples):
    """`rollout.first_action: question` (s3's shape): each episode's first turn is the runner's own
    search of the question, every id of it masked, served from the index's own top k before the policy
    writes anything; with second_action: search and the last turn a forced answer, the policy's only
    turn is the second search's query, and its ids start right after the first observation."""
    model, tok = smollm2_policy
    protocol = get_protocol("search_r1")
    cfg = replace(GREEDY, first_action="question", second_action="search", last_action="answer", max_turns=3,
                  max_turn_tokens=48, max_response_tokens=300)
    reference, _ = run_episodes(HFEngine(model, tok), protocol, index, samples, cfg)
    engine = StaticEngine(model, tok, max_batch_size=4, check_every=4)
    engine.generate = no_generate
    retriever = CountingRetriever(index)
    trajs, _ = run_episodes(engine, protocol, retriever, samples, cfg)
    assert summary(trajs) == summary(reference)
    questions = [s["question"] for s in samples for _ in range(cfg.n)]
    assert retriever.calls[0] == questions          # one call for every episode's question, before any turn
    own = index.search(questions, cfg.topk)
    opening = protocol.search_opening(NEXT_SEARCH_THOUGHT, first=False)
    for t, hits in zip(trajs, own):
        first = t.turns[0]
        assert first.kind == "search" and first.queries == [t.question]
        assert first.action_text == protocol.search_action([t.question])
        assert first.passage_ids == [[h.id for h in hits]] and first.observation
        # nothing before the policy's first generated id is the policy's: prompt, the runner's search, its observation
        b = t.action_mask.index(1)
        written = (tok.encode(first.action_text, add_special_tokens=False)
                   + tok.encode(first.observation, add_special_tokens=False)
                   + tok.encode(opening, add_special_tokens=False))
        assert t.token_ids[t.prompt_len:b] == written and t.action_mask[:b] == [0] * b
        assert t.turns[1].action_text.startswith(opening)
    # searches counted and scored include the runner's: two where the policy's query parsed, else one
    assert all(t.num_searches == 1 + (t.turns[1].kind == "search") for t in trajs)
    assert any(t.turns[1].kind == "search" for t in trajs)


def _last_masked_run(t) -> list[int]:
    """The ids of the last run of masked ids before the last turn's generated ids."""
    end = max(i for i, m in enumerate(t.action_mask) if m == 1)
    while t.action_mask[end] == 1:
        end -= 1
    start = end
    while start > t.prompt_len and t.action_mask[start - 1] == 0:
        start -= 1
    return t.token_ids[start:end + 1]
