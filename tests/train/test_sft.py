"""SFT warm start: synthesised gold episodes have the rollout's token layout, and fitting lowers the loss."""
import random

import pytest
import torch

from ragrl.rollout.protocol import READ_THOUGHT, get_protocol
from ragrl.datasets import load_questions
from ragrl.paths import DEMO_CORPUS
from ragrl.retrieval.base import Hit
from ragrl.retrieval.corpus import load_corpus
from ragrl.retrieval.resolve import make_retriever
from ragrl.rollout.config import RolloutConfig
from ragrl.methods.synthetic import _with_gold, answer_visible, synth_trajectory
from ragrl.train.sft import run_sft


@pytest.fixture(scope="module")
def passages():
    c = load_corpus(DEMO_CORPUS)
    return {c.ids[i]: Hit(c.ids[i], c.titles[i], c.texts[i], 0.0) for i in range(len(c))}


def _hit(i):
    return Hit(f"p{i}", f"T{i}", "text", float(-i))


def test_with_gold_puts_every_gold_in_top_k_replacing_the_lowest_non_gold():
    hits = [_hit(1), _hit(2), _hit(3)]
    out = _with_gold(hits, [_hit(9), _hit(2)], 3)
    assert [h.id for h in out] == ["p1", "p2", "p9"]  # p3 (lowest, not gold) replaced; p2 kept
    assert [h.id for h in _with_gold(hits[:1], [_hit(9)], 3)] == ["p1", "p9"]
    # more golds than k, the retriever found only later ones: the first k golds still get in
    out = _with_gold([_hit(2), _hit(3), _hit(4)], [_hit(1), _hit(2), _hit(3), _hit(4)], 3)
    assert sorted(h.id for h in out) == ["p1", "p2", "p3"]


@pytest.mark.parametrize("agent,max_turns", [("search_r1", 2), ("search_r1", 3), ("r1_searcher", 2), ("rag_r1", 2)])
def test_synthesised_episode_layout(smollm2_policy, demo_bm25_dir, passages, agent, max_turns):
    _, tok = smollm2_policy
    protocol = get_protocol(agent)
    cfg = RolloutConfig(max_turns=max_turns, topk=3, passage_words=30, max_obs_tokens=160)
    sample = next(s for s in load_questions("demo-train") if len(s.get("gold_passage_ids", [])) == 2)
    t = synth_trajectory(tok, protocol, sample, make_retriever(str(demo_bm25_dir)), passages, cfg, random.Random(0))
    assert len(t.token_ids) == len(t.action_mask) == len(t.logprobs)
    assert t.action_mask[: t.prompt_len] == [0] * t.prompt_len
    # mask-1 spans decode to the actions, mask-0 spans after the prompt to the observations
    spans, cur, kind = [], [], None
    for tid, m in zip(t.token_ids[t.prompt_len:], t.action_mask[t.prompt_len:]):
        if m != kind and cur:
            spans.append((kind, tok.decode(cur)))
            cur = []
        kind = m
        cur.append(tid)
    spans.append((kind, tok.decode(cur)))
    assert [s for k, s in spans if k == 1] == [turn.action_text for turn in t.turns]
    assert [s for k, s in spans if k == 0] == [turn.observation for turn in t.turns if turn.observation]
    # the protocol reads its own synthesised episode as well formed, with the gold answer
    assert protocol.is_valid_format("".join(x.action_text + x.observation for x in t.turns))
    assert t.answer == sample["answers"][0] and t.num_searches == (1 if agent == "rag_r1" else max_turns - 1)
    # The answer follows the documents with no fixed sentence before it for the policy to copy
    # into the answer (R1-Searcher must still close the <think> its query opened).
    answer_turn = t.turns[-1].action_text
    if agent == "r1_searcher":
        assert answer_turn.lstrip().startswith(READ_THOUGHT)
    else:
        assert answer_turn.startswith(protocol.answer[0]) and protocol.think[0] not in answer_turn
    retrieved = set(t.retrieved_ids)
    if max_turns == 2 or agent == "rag_r1":  # one search: every gold passage is in its results
        assert set(sample["gold_passage_ids"]) <= retrieved
    assert all(len(tok.encode(x.observation, add_special_tokens=False)) <= 160 for x in t.turns if x.observation)


@pytest.mark.parametrize("agent", ["search_r1", "r1_searcher", "rag_r1"])
def test_direct_episode_answers_at_once_and_parses(smollm2_policy, agent):
    from ragrl.methods.synthetic import direct_trajectory

    _, tok = smollm2_policy
    protocol = get_protocol(agent)
    sample = load_questions("demo-train")[0]
    t = direct_trajectory(tok, protocol, sample)
    action = t.turns[0].action_text
    assert t.num_searches == 0 and len(t.turns) == 1 and t.answer == sample["answers"][0]
    assert tok.decode(t.token_ids[t.prompt_len:]) == action and all(t.action_mask[t.prompt_len:])
    parsed = protocol.parse(action)
    assert parsed.kind == "answer" and parsed.answer == sample["answers"][0]
    assert protocol.is_valid_format(action)


def test_warm_start_mixes_in_direct_episodes(smollm2_policy, demo_bm25_dir):
    """sft.direct_frac of the episodes answer without searching; a bad fraction is refused."""
    from ragrl.errors import ConfigError
    from ragrl.methods.synthetic import warm_start_episodes
    from ragrl.train.recipe import load_train_config

    _, tok = smollm2_policy
    retriever = make_retriever(str(demo_bm25_dir))
    cfg = load_train_config("search_r1_grpo", ["sft.direct_frac=0.25"], variant="tiny")
    trajs = warm_start_episodes(cfg, tok, retriever)
    direct = [t for t in trajs if t.num_searches == 0]
    assert direct and all(len(t.turns) == 1 and t.turns[0].kind == "answer" for t in direct)
    assert abs(len(direct) / len(trajs) - 0.25) < 0.01
    cfg.sft.direct_frac = 0.0
    assert all(t.num_searches > 0 for t in warm_start_episodes(cfg, tok, retriever))
    cfg.sft.direct_frac = 1.0
    with pytest.raises(ConfigError, match="sft.direct_frac must be in"):
        warm_start_episodes(cfg, tok, retriever)


def test_answer_visible_filter(smollm2_policy, demo_bm25_dir, passages):
    _, tok = smollm2_policy
    protocol = get_protocol("search_r1")
    cfg = RolloutConfig(max_turns=2, topk=3, passage_words=30, max_obs_tokens=160)
    s = dict(next(s for s in load_questions("demo-train") if s.get("gold_passage_ids")))
    t = synth_trajectory(tok, protocol, s, make_retriever(str(demo_bm25_dir)), passages, cfg, random.Random(0))
    t.golds = ["zzqx unseen answer"]
    assert not answer_visible(t)
    t.golds = ["yes"]
    assert answer_visible(t)
    t.golds = [t.turns[0].observation.split("Doc 1 (Title: \"")[1].split('"')[0]]  # a title shown in it
    assert answer_visible(t)


def test_run_sft_lowers_the_masked_nll_on_the_tiny_model(tiny_model_dir, demo_bm25_dir, passages):
    from ragrl.models.lm_weights import load_policy

    model, tok = load_policy(str(tiny_model_dir))   # full fine-tuning of the 3M-parameter model
    protocol = get_protocol("search_r1")
    cfg = RolloutConfig(max_turns=2, topk=2, passage_words=12, max_obs_tokens=96)
    rng = random.Random(0)
    samples = [s for s in load_questions("demo-train") if s.get("gold_passage_ids")][:4]
    trajs = [synth_trajectory(tok, protocol, s, make_retriever(str(demo_bm25_dir)), passages, cfg, rng) for s in samples]
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    res = run_sft(model, tok, trajs, steps=12, batch_size=4, lr=3e-3, seed=0)
    assert len(res.losses) == 12
    assert res.losses[-1] < res.losses[0] - 1.0  # same 4 episodes every step: the NLL must fall clearly
    after = [p for p in model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


def _norm(text):
    from ragrl.rewards.qa import normalize_answer
    return f" {normalize_answer(text)} "


def test_missed_gold_searches_again_only_for_a_missed_title_it_has_read(smollm2_policy, demo_bm25_dir, passages):
    """next_query='missed_gold': every further query is the title of a gold passage no earlier search
    showed, and that title occurs in the question or an earlier observation; with none, it answers.
    The first search is every_gold's, so only the further searches differ."""
    _, tok = smollm2_policy
    protocol = get_protocol("search_r1")
    cfg = RolloutConfig(max_turns=4, topk=3, passage_words=30, max_obs_tokens=160)
    retriever = make_retriever(str(demo_bm25_dir))
    samples = [s for s in load_questions("demo-train") if len(s.get("gold_passage_ids", [])) >= 2][:40]
    searches = []
    for s in samples:
        t = synth_trajectory(tok, protocol, s, retriever, passages, cfg, random.Random(0), next_query="missed_gold")
        old = synth_trajectory(tok, protocol, s, retriever, passages, cfg, random.Random(0))
        assert t.turns[0].action_text == old.turns[0].action_text
        assert t.turns[0].passage_ids == old.turns[0].passage_ids
        assert t.turns[-1].kind == "answer" and t.answer == s["answers"][0]
        golds = {passages[i].title: i for i in s["gold_passage_ids"]}
        for i, turn in enumerate(t.turns[1:-1], start=1):
            (query,) = turn.queries
            shown = {pid for earlier in t.turns[:i] for ids in earlier.passage_ids for pid in ids}
            read = _norm(" ".join([s["question"]] + [earlier.observation for earlier in t.turns[:i]]))
            assert query in golds and golds[query] not in shown and _norm(query) in read
            assert golds[query] in turn.passage_ids[0]   # its gold is put into its results
        # It stopped because no gold is left that it missed and can read.
        shown = {pid for turn in t.turns for ids in turn.passage_ids for pid in ids}
        read = _norm(" ".join([s["question"]] + [turn.observation for turn in t.turns]))
        if t.num_searches < cfg.max_turns - 1:
            assert all(g in shown or _norm(passages[g].title) not in read for g in s["gold_passage_ids"])
        searches.append(t.num_searches)
    # Both kinds occur on the demo questions: the test is not vacuous either way.
    assert 1 in searches and any(n > 1 for n in searches)


def test_gold_search_missed_is_refused_for_an_agent_of_several_queries_and_bad_modes():
    from ragrl.errors import ConfigError
    from ragrl.train.check import check_combinations
    from ragrl.train.recipe import load_train_config

    cfg = load_train_config("rag_r1_ppo", ["sft.builder=gold_search_missed", "sft.steps=4"], variant="tiny")
    with pytest.raises(ConfigError, match="gold_search_missed writes one query a search, and agent rag_r1"):
        check_combinations(cfg)
    cfg = load_train_config("search_r1_grpo", ["sft.builder=gold_search_missed"], variant="tiny")
    check_combinations(cfg)   # one query a search: accepted
    with pytest.raises(ConfigError, match="sft.builder"):
        load_train_config("search_r1_grpo", ["sft.builder=gold_search_mised"], variant="tiny")
    with pytest.raises(ConfigError, match="next_query must be one of"):
        synth_trajectory(None, get_protocol("search_r1"), {"question": "q", "answers": ["a"]}, None, {},
                         RolloutConfig(), random.Random(0), next_query="every")


def test_missed_after_question_writes_the_episode_the_runner_makes(smollm2_policy, demo_bm25_dir, passages):
    """sft.builder=missed_after_question: played through the real runner (first_action=question,
    second_action=search; a scripted engine writes what the policy writes), each episode's tokens and
    mask are the runner's up to its query's end: the question's own search (the index's own results)
    and the second search's opening are the runner's, masked, and the only trained search text is a
    query naming a gold title the first search did not show but the question or its passages name.
    A run without that episode shape is refused on load."""
    from dataclasses import replace

    from ragrl.errors import ConfigError
    from ragrl.methods.synthetic import missed_after_question_episodes
    from ragrl.rollout.multi_turn import run_episodes
    from ragrl.rollout.protocol import NEXT_SEARCH_THOUGHT
    from ragrl.train.check import check_combinations
    from ragrl.train.recipe import load_train_config
    from tests.rollout.scripted import ScriptedEngine

    _, tok = smollm2_policy
    retriever = make_retriever(str(demo_bm25_dir))
    # Four turns allowed: the builder still writes one query (the runner opens no third search).
    shape = ["rollout.first_action=question", "rollout.second_action=search", "rollout.max_turns=4",
             "sft.builder=missed_after_question", "sft.direct_frac=0"]
    cfg = load_train_config("search_r1_grpo", shape, variant="tiny")
    check_combinations(cfg)
    trajs = missed_after_question_episodes(cfg, tok, retriever)
    samples = {s["question"]: s for s in load_questions(cfg.data.train)}
    assert trajs and all(t.num_searches == 2 and t.turns[-1].kind == "answer" for t in trajs)
    protocol = get_protocol("search_r1")
    opening = protocol.search_opening(NEXT_SEARCH_THOUGHT, first=False)
    for t in trajs[:6]:
        sample = samples[t.question]
        first, second, answer = t.turns
        own = retriever.search([sample["question"]], cfg.rollout.topk)[0]
        assert first.queries == [sample["question"]] and first.passage_ids == [[h.id for h in own]]
        (query,) = second.queries
        missed = {passages[g].title for g in sample["gold_passage_ids"] if g not in first.passage_ids[0]}
        assert query in missed and _norm(query) in _norm(sample["question"] + " " + first.observation)
        assert second.action_text.startswith(opening)
        trained = tok.decode([i for i, m in zip(t.token_ids, t.action_mask) if m])
        assert query in trained and opening not in trained and sample["question"] not in trained
        engine = ScriptedEngine(tok, protocol, {sample["question"]: [second.action_text[len(opening):],
                                                                      answer.action_text]})
        [played], _ = run_episodes(engine, protocol, retriever, [sample], replace(cfg.rollout, n=1))
        end = t.action_mask.index(1)      # the first trained run of tokens is the query's action
        while t.action_mask[end]:
            end += 1
        assert played.token_ids[:end] == t.token_ids[:end] and played.action_mask[:end] == t.action_mask[:end]
        assert played.turns[0].passage_ids == first.passage_ids and played.turns[1].queries == [query]
    for wrong in (["rollout.first_action=search"], ["rollout.second_action=free"]):
        cfg = load_train_config("search_r1_grpo", shape + wrong, variant="tiny")
        with pytest.raises(ConfigError, match="missed_after_question writes the episode"):
            check_combinations(cfg)
