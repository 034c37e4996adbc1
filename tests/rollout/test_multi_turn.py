"""The multi-turn rollout loop: token bookkeeping on real SmolLM2 samples, batched multi-query
retrieval and every budget, on a real BM25 index.

Untrained SmolLM2 rarely writes tags, so the real-model runs are two: the plain Search-R1 prompt
(feedback observations mostly) and the same protocol with a few-shot chat history that nudges the
model into opening with <search> (real retrievals). Exact multi-turn scenarios are driven by
`ScriptedEngine`, a fake that injects pre-written turns tokenised with the real tokenizer.
"""
import json
import re

import pytest
import torch

from ragrl.rollout.protocol import get_protocol
from ragrl.methods.search_r1 import SearchR1Protocol
from ragrl.datasets import load_questions
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import prompt_ids, run_episodes
from ragrl.rollout.observations import build_observation, build_observations
from ragrl.rollout.trajectory import EpisodeEnd
from ragrl.engines.hf import HFEngine
from ragrl.policy.logprobs import action_logprobs
from ragrl.rewards.format import is_well_formed
from ragrl.rewards.search import answer_in_docs_reward
from tests.rollout.scripted import CountingRetriever, RecordingEngine, ScriptedEngine, check_token_invariants, spans

STOP_REASONS = {EpisodeEnd.ANSWER, EpisodeEnd.MAX_TURNS, EpisodeEnd.MAX_TOKENS, EpisodeEnd.NO_ANSWER}


class NudgedSearchR1(SearchR1Protocol):
    """Search-R1 with two worked chat turns that open with <search>: a prompt-level nudge."""

    def messages(self, question):
        shots = [("Who directed Jaws?", "<search> Jaws film director </search>"),
                 ("Who wrote Hamlet?", "<search> Hamlet play author </search>")]
        msgs = [{"role": "system", "content": "Look things up with <search> query </search>; "
                                              "answer with <answer> a few words </answer>."}]
        for q, a in shots:
            msgs += [{"role": "user", "content": f"Question: {q}"}, {"role": "assistant", "content": a}]
        return msgs + [{"role": "user", "content": f"Question: {question}"}]


@pytest.fixture(scope="module")
def tok(smollm2_policy):
    return smollm2_policy[1]


@pytest.fixture(scope="module")
def eos_ids(smollm2_policy):
    model, tok = smollm2_policy
    return HFEngine(model, tok).eos_token_ids


@pytest.fixture(scope="module")
def samples():
    return load_questions("demo-eval", limit=4)


@pytest.fixture(scope="module", params=["plain", "nudged"])
def real_run(request, smollm2_policy, index, samples):
    """4 questions x 2 samples, temperature 1, seeded, 3 turns, small budgets, real SmolLM2."""
    model, tok = smollm2_policy
    protocol = NudgedSearchR1() if request.param == "nudged" else get_protocol("search_r1")
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=12 if request.param == "plain" else 20,
                        max_response_tokens=110, max_obs_tokens=64, passage_words=20, topk=2,
                        temperature=1.0, n=2, seed=11)
    engine = RecordingEngine(HFEngine(model, tok))
    retriever = CountingRetriever(index)
    trajs, stats = run_episodes(engine, protocol, retriever, samples, cfg)
    return dict(kind=request.param, trajs=trajs, stats=stats, engine=engine, retriever=retriever,
                protocol=protocol, cfg=cfg, model=model, tok=tok)


# ------------------------------------------------------------------ real SmolLM2, real HFEngine

def test_trajectory_is_prompt_plus_each_turns_generation_and_observation(real_run, samples):
    trajs, calls, tok = real_run["trajs"], real_run["engine"].calls, real_run["tok"]
    assert len(trajs) == 2 * len(samples)
    assert [t.group for t in trajs] == [0, 0, 1, 1, 2, 2, 3, 3]
    # Rebuild every trajectory from the engine's own record, independently of the loop's lists.
    rebuilt = {}
    for t in trajs:
        rebuilt[id(t)] = (prompt_ids(tok, real_run["protocol"], t.question), [], [])
        assert t.prompt_len == len(rebuilt[id(t)][0])
    assert len(calls) == max(t.num_turns for t in trajs)
    for k, (prompts, gens) in enumerate(calls):
        active = [t for t in trajs if t.num_turns > k]  # each call serves the active rows in order
        assert len(prompts) == len(gens) == len(active)
        for t, prompt, gen in zip(active, prompts, gens):
            ids, mask, logprobs = rebuilt[id(t)]
            assert prompt == ids  # the engine saw exactly the ids the trajectory holds
            obs_ids = tok.encode(t.turns[k].observation, add_special_tokens=False)
            rebuilt[id(t)] = (ids + gen.token_ids + obs_ids,
                              mask + [1] * len(gen.token_ids) + [0] * len(obs_ids),
                              logprobs + gen.logprobs + [0.0] * len(obs_ids))
    for t in trajs:
        ids, mask, logprobs = rebuilt[id(t)]
        assert t.token_ids == ids
        assert t.action_mask == [0] * t.prompt_len + mask
        assert t.logprobs == [0.0] * t.prompt_len + logprobs  # engine log-probs, exactly, on-mask
    assert real_run["stats"]["gen_tokens"] == sum(t.num_action_tokens for t in trajs)
    # Seeded temperature-1 sampling: the two samples of a question are different episodes.
    differ = sum(trajs[2 * i].response_ids != trajs[2 * i + 1].response_ids for i in range(len(samples)))
    assert differ >= 3


def test_action_mask_spans_decode_to_actions_and_observations(real_run, eos_ids):
    cfg = real_run["cfg"]
    for t in real_run["trajs"]:
        check_token_invariants(t, real_run["tok"], eos_ids)
        # Every end is an EpisodeEnd member (the one vocabulary), and serialises as its plain string.
        assert isinstance(t.stop_reason, EpisodeEnd) and t.stop_reason in STOP_REASONS
        assert 1 <= t.num_turns <= cfg.max_turns
        assert json.loads(json.dumps(t.to_dict()))["stop_reason"] == t.stop_reason.value
        assert (t.stop_reason == "answer") == (t.answer is not None)
        assert len(t.response_ids) <= cfg.max_response_tokens + cfg.max_obs_tokens
        assert t.format_errors == sum(turn.kind == "invalid" for turn in t.turns)


def test_rescoring_the_ids_reproduces_the_sampling_logprobs(real_run):
    """No re-tokenisation drift: one forward pass over the stored ids gives the rollout's log-probs."""
    trajs = real_run["trajs"][::2]  # one sample per question keeps the forward pass short
    width = max(len(t.token_ids) for t in trajs)
    ids = torch.zeros(len(trajs), width, dtype=torch.long)
    attention, actions, sampled = (torch.zeros(len(trajs), width) for _ in range(3))
    for i, t in enumerate(trajs):  # right padding
        n = len(t.token_ids)
        ids[i, :n], attention[i, :n] = torch.tensor(t.token_ids), 1
        actions[i, :n], sampled[i, :n] = torch.tensor(t.action_mask, dtype=torch.float), torch.tensor(t.logprobs)
    with torch.no_grad():
        rescored, _ = action_logprobs(real_run["model"], ids, attention.long(), actions.long())
    assert actions.sum() > 30
    on = actions.bool()
    torch.testing.assert_close(rescored[on], sampled[on], atol=1e-4, rtol=0)
    assert bool((rescored[~on] == 0).all())


@pytest.mark.parametrize("real_run", ["plain"], indirect=True)
def test_plain_prompt_prose_is_answered_with_feedback(real_run):
    """Untrained SmolLM2 mostly writes prose: each such turn gets the protocol's hint, mask 0."""
    invalid = [turn for t in real_run["trajs"] for turn in t.turns if turn.kind == "invalid"]
    with_hint = [turn for turn in invalid if turn.observation]
    assert with_hint and all(turn.observation == real_run["protocol"].format_feedback(turn.error) for turn in with_hint)


@pytest.mark.parametrize("real_run", ["nudged"], indirect=True)
def test_nudged_model_searches_and_gets_the_index_passages(real_run, index):
    searches = [turn for t in real_run["trajs"] for turn in t.turns if turn.kind == "search"]
    assert len(searches) >= 2
    expected_calls = []
    for k in range(len(real_run["engine"].calls)):
        batch = [q for t in real_run["trajs"] if t.num_turns > k for q in t.turns[k].queries if t.turns[k].observation]
        if batch:
            expected_calls.append(batch)
    assert real_run["retriever"].calls == expected_calls  # one batched call per turn
    for turn in searches:
        if turn.observation:  # a search on the final turn is not run
            assert turn.passage_ids == [[h.id for h in index.search(turn.queries, 2)[0]]]
            assert turn.observation.startswith("\n\n<information>") and turn.observation.endswith("</information>\n\n")


# ------------------------------------------------------------------ scripted turns, exact scenarios

def run_script(tok, protocol, scripts, index, **cfg_kwargs):
    engine = ScriptedEngine(tok, protocol, scripts)
    retriever = CountingRetriever(index)
    samples = [{"id": f"q{i}", "question": q, "answers": ["x"]} for i, q in enumerate(scripts)]
    cfg = RolloutConfig(**{"max_turns": 3, "max_turn_tokens": 64, "max_response_tokens": 1024,
                           "max_obs_tokens": 400, "topk": 2, **cfg_kwargs})
    trajs, _ = run_episodes(engine, protocol, retriever, samples, cfg)
    return trajs, engine, retriever


def observation_groups(observation: str) -> list[tuple[str, list[str]]]:
    """[(query label line, [doc lines])] of a grouped observation."""
    groups = []
    for line in observation.splitlines():
        if re.match(r"(<information>)?Query \d+: ", line):
            groups.append((line.removeprefix("<information>"), []))
        elif re.match(r"Doc \d+ \(Title: ", line):
            groups[-1][1].append(line)
    return groups


def test_multi_query_searches_go_to_the_retriever_in_one_call_per_turn(tok, eos_ids, index, samples):
    protocol = get_protocol("rag_r1")
    q0, q1, q2 = (s["question"] for s in samples[:3])
    scripts = {
        q0: ["<think>Two battles.</think>\n<search> Battle of Manila; Battle of Guam; Manila Bay </search>",
             "<search> Spanish-American War </search>", "<answer> Battle of Guam </answer>"],
        q1: ["<search> Lisa Raymond; Liezel Huber </search>", "<answer> Liezel Huber </answer>"],
        q2: [("<think>Who played Roger Murtaugh?", "length"), "<search> Danny Glover </search>",
             "<answer> 1946 </answer>"],
    }
    trajs, engine, retriever = run_script(tok, protocol, scripts, index, n=2, temperature=1.0)
    assert retriever.calls == [
        ["Battle of Manila", "Battle of Guam", "Manila Bay"] * 2 + ["Lisa Raymond", "Liezel Huber"] * 2,
        ["Spanish-American War"] * 2 + ["Danny Glover"] * 2,
    ]
    assert [t.stop_reason for t in trajs] == ["answer"] * 6
    assert [t.num_searches for t in trajs] == [2, 2, 1, 1, 1, 1]
    for t in trajs:
        check_token_invariants(t, tok, eos_ids)
        for turn in t.turns:
            if turn.kind != "search":
                continue
            hits = index.search(turn.queries, 2)
            assert turn.passage_ids == [[h.id for h in hs] for hs in hits]
            groups = observation_groups(turn.observation)
            assert [label for label, _ in groups] == [f"Query {i}: {q}" for i, q in enumerate(turn.queries, 1)]
            for (_, docs), hs in zip(groups, hits):
                assert len(docs) == len(hs) == 2
                for j, (line, h) in enumerate(zip(docs, hs), 1):
                    assert line.startswith(f'Doc {j} (Title: "{h.title}")')


def test_max_turns_ends_the_episode_without_running_the_last_search(tok, eos_ids, index, samples):
    q0, q1 = samples[0]["question"], samples[1]["question"]
    script = {q0: ["<search> Maria Golovin </search>", "<search> Gian Carlo Menotti </search>",
                   "<answer> never reached </answer>"],
              q1: ["<search> Battle of Guam </search>", ("<think>Still thinking about", "length"),
                   "<answer> never reached </answer>"]}
    trajs, engine, retriever = run_script(tok, get_protocol("search_r1"), script, index, max_turns=2)
    assert len(engine.calls) == 2 and retriever.calls == [["Maria Golovin", "Battle of Guam"]]
    for t, last_kind in zip(trajs, ["search", "invalid"]):
        check_token_invariants(t, tok, eos_ids)
        assert (t.stop_reason, t.num_turns, t.answer, t.turns[1].kind) == ("max_turns", 2, None, last_kind)
        assert t.turns[0].observation and t.turns[1].observation == "" and t.turns[1].passage_ids == []
        assert t.action_mask[-1] == 1  # the episode ends on the policy's tokens: no dead observation


def test_end_after_searches_serves_the_last_search_and_ends_on_its_passages(tok, eos_ids, index, samples):
    q0, q1, q2 = (s["question"] for s in samples[:3])
    script = {q0: ["<search> Maria Golovin </search>", "<search> Gian Carlo Menotti </search>",
                   "<answer> never reached </answer>"],
              q1: ["<answer> Guam </answer>"],                                   # answers before searching
              q2: [("<think>Still thinking about", "length"), "<search> Battle of Guam </search>",
                   "<answer> Guam </answer>"]}         # one search, below the quota: a whole episode
    trajs, engine, retriever = run_script(tok, get_protocol("search_r1"), script, index, end_after_searches=2)
    assert retriever.calls == [["Maria Golovin"], ["Gian Carlo Menotti", "Battle of Guam"]]
    first, answered, late = trajs
    assert (first.stop_reason, first.num_searches, first.num_turns) == (EpisodeEnd.RETRIEVED, 2, 2)
    last = first.turns[-1]
    # The last search's passages are recorded (rewards read them) but not appended: no turn follows.
    assert last.passage_ids and last.passage_texts[0][0] and last.observation == ""
    assert answer_in_docs_reward(first, {"answers": [last.passage_texts[0][0].split()[-1]]}) == 1.0
    assert [v for v, _, _ in spans(first.action_mask, first.prompt_len)] == [1, 0, 1]   # search, its passages, search
    assert (answered.stop_reason, answered.answer) == (EpisodeEnd.ANSWER, "Guam")
    assert (late.stop_reason, late.num_searches, late.format_errors) == (EpisodeEnd.ANSWER, 1, 1)
    for t in trajs:
        check_token_invariants(t, tok, eos_ids)

    # The quota's search is served even on the last turn, where a search is otherwise dropped.
    (t,), _, retriever = run_script(tok, get_protocol("search_r1"), {q0: script[q0]}, index, max_turns=1,
                                    end_after_searches=1)
    assert retriever.calls == [["Maria Golovin"]] and t.stop_reason == EpisodeEnd.RETRIEVED
    assert t.retrieved_ids == t.turns[0].passage_ids[0]


def test_max_response_tokens_caps_each_turn_and_ends_with_max_tokens(tok, eos_ids, index, samples):
    q = samples[1]["question"]
    rambling = "<think>" + "The battle took place long ago in the Pacific. " * 30
    script = {q: ["<search> Battle of Guam </search>", (rambling, "length"), "<answer> x </answer>"]}
    (t,), engine, _ = run_script(tok, get_protocol("search_r1"), script, index, max_turn_tokens=64,
                                 max_response_tokens=100, max_obs_tokens=40)
    check_token_invariants(t, tok, eos_ids)
    second_action_begin = spans(t.action_mask, t.prompt_len)[2][1]
    used_by_first_turn = second_action_begin - t.prompt_len  # first action + its observation
    assert engine.calls[0][1][0].max_new_tokens == 64
    assert engine.calls[1][1][0].max_new_tokens == 100 - used_by_first_turn < 64
    assert (t.stop_reason, t.num_turns, t.format_errors) == ("max_tokens", 2, 1)
    assert len(t.response_ids) == 100 and t.turns[1].observation == ""  # no hint once the budget is spent

    # An observation that crosses the budget ends the episode right after it.
    (t,), engine, _ = run_script(tok, get_protocol("search_r1"), script, index, max_response_tokens=30,
                                 max_obs_tokens=40)
    assert (t.stop_reason, t.num_turns, len(engine.calls)) == ("max_tokens", 1, 1)
    assert t.turns[0].observation and 30 <= len(t.response_ids) <= 30 + 40


@pytest.mark.parametrize("budget", [60, 120, 192, 400])
def test_observations_fit_max_obs_tokens_with_tags_intact(tok, eos_ids, index, samples, budget):
    q = samples[2]["question"]
    script = {q: ["<search> Lisa Raymond doubles; Liezel Huber doubles; Grand Slam women's doubles </search>",
                  "<answer> Liezel Huber </answer>"]}
    (t,), _, _ = run_script(tok, get_protocol("rag_r1"), script, index, topk=3, passage_words=40,
                            max_obs_tokens=budget)
    check_token_invariants(t, tok, eos_ids)
    obs = t.turns[0].observation
    (_, begin, end), = [run for run in spans(t.action_mask, t.prompt_len) if run[0] == 0]
    assert end - begin == len(tok.encode(obs, add_special_tokens=False)) <= budget
    assert obs.startswith("\n\n<information>") and obs.endswith("</information>\n\n")
    assert obs.count("<information>") == obs.count("</information>") == 1
    groups = observation_groups(obs)
    assert [label for label, _ in groups] == [f"Query {i}: {q}" for i, q in enumerate(t.turns[0].queries, 1)]
    assert [len(ids) for ids in t.turns[0].passage_ids] == [3, 3, 3]  # every retrieved id is recorded
    # Passages shrink first; past title-only, each query shows its best-ranked documents only.
    shown = {len(docs) for _, docs in groups}
    assert len(shown) == 1 and shown.pop() >= (3 if budget == 400 else 1 if budget >= 120 else 0)
    for (_, docs), hits in zip(groups, index.search(t.turns[0].queries, 3)):
        for j, (line, h) in enumerate(zip(docs, hits), 1):
            header = f'Doc {j} (Title: "{h.title}")'
            assert line.startswith(header)
            passage_words = [w for w in line[len(header):].removesuffix("</information>").split() if w != "..."]
            assert len(passage_words) <= 40  # shortened passages (cut marks aside)


@pytest.mark.parametrize("budget", [40, 120, 512])
def test_batched_observations_equal_one_at_a_time(tok, index, budget):
    """build_observations (one batched tokenisation) gives what build_observation gives per search,
    within the budget and over it (shrunk one by one), for one to three queries a search."""
    questions = [q["question"] for q in load_questions("demo-train", limit=12)]
    searches = [(questions[i:i + 1 + i % 3], index.search(questions[i:i + 1 + i % 3], 3)) for i in range(12)]
    cfg = RolloutConfig(max_obs_tokens=budget, passage_words=60, topk=3)
    batched = build_observations(tok, get_protocol("rag_r1"), searches, cfg)
    assert batched == [build_observation(tok, get_protocol("rag_r1"), qs, hits, cfg) for qs, hits in searches]
    over = [len(ids) > budget for _, ids in batched]
    assert not any(over) if budget >= 120 else any(over)   # 40 is below three queries' bare tags
    assert build_observations(tok, get_protocol("rag_r1"), [], cfg) == []


def test_max_queries_per_call_truncates_the_search(tok, eos_ids, index, samples):
    q = samples[3]["question"]
    script = {q: ["<search> Danny Glover; Lethal Weapon; Roger Murtaugh; Namibia film </search>", "<answer> x </answer>"]}
    (t,), _, retriever = run_script(tok, get_protocol("rag_r1", max_queries=5), script, index, max_queries_per_call=2)
    check_token_invariants(t, tok, eos_ids)
    assert t.turns[0].queries == ["Danny Glover", "Lethal Weapon"]
    assert retriever.calls == [["Danny Glover", "Lethal Weapon"]]
    assert len(t.turns[0].passage_ids) == 2
    assert [label for label, _ in observation_groups(t.turns[0].observation)] == \
        ["Query 1: Danny Glover", "Query 2: Lethal Weapon"]



def test_first_action_search_opens_every_episode_with_a_search_the_policy_finishes(tok, index):
    """rollout.first_action=search: the runner writes the protocol's search opening after the prompt
    (masked: the policy did not write it); the policy's first turn is only the query, and it parses,
    and is kept as text, as the whole search action."""
    protocol = get_protocol("search_r1")
    opening = protocol.search_opening()
    assert opening == "<think>I need to search for this.</think>\n<search>"
    question = "Who directed Jaws?"
    # the engine sees the prompt with the opening after it, so its script starts with the query
    engine = ScriptedEngine(tok, protocol, {question: [" Jaws film director </search>", "<answer> Spielberg </answer>"]})
    retriever = CountingRetriever(index)
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=64, max_response_tokens=1024, max_obs_tokens=400, topk=2,
                        first_action="search")
    [t], _ = run_episodes(engine, protocol, retriever, [{"id": "q0", "question": question, "answers": ["x"]}], cfg)
    opening_ids = tok.encode(opening, add_special_tokens=False)
    prompt = prompt_ids(tok, protocol, question)
    assert t.token_ids[: t.prompt_len] == prompt + opening_ids and t.prompt_len == len(prompt) + len(opening_ids)
    assert t.action_mask[: t.prompt_len] == [0] * t.prompt_len
    assert t.turns[0].kind == "search" and t.turns[0].queries == ["Jaws film director"]
    assert t.turns[0].action_text == opening + " Jaws film director </search>"
    assert retriever.calls == [["Jaws film director"]]
    assert t.answer == "Spielberg" and t.num_searches == 1 and is_well_formed(t)
    # free (the default): the same script's first turn is a bare query with no open tag, a format error
    engine = ScriptedEngine(tok, protocol, {question: [" Jaws film director </search>", "<answer> Spielberg </answer>"]})
    [free], _ = run_episodes(engine, protocol, CountingRetriever(index), [{"id": "q0", "question": question, "answers": ["x"]}],
                             RolloutConfig(max_turns=3, max_turn_tokens=64, max_response_tokens=1024, topk=2))
    assert free.turns[0].kind == "invalid" and free.prompt_len == len(prompt)
