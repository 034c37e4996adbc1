"""Malformed model output never breaks the rollout loop.

Each case injects exact turns through `ScriptedEngine` (real SmolLM2 tokenizer, real BM25 index)
and checks what the loop made of them: the action kind and error the protocol assigns, a
feedback observation (mask 0) after an invalid turn, the format-error count, and that text the
model wrote in observation tags stays the policy's own tokens (mask 1), never retrieved evidence.
"""
import pytest

from ragrl.rollout.protocol import get_protocol
from ragrl.datasets import load_questions
from ragrl.models.lm_weights import load_tokenizer
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import run_episodes
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory
from tests.rollout.scripted import CountingRetriever, ScriptedEngine, check_token_invariants, spans

ANSWER = "<answer> Gian Carlo Menotti </answer>"
FAKE_DOC = 'Doc 1 (Title: "Invented") p999999 says the composer was Mozart.'
LONG_ANSWER = "<answer> " + ("Menotti wrote it " * 700)[:10_000] + " </answer>"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def eos_ids(tok):
    return {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}


@pytest.fixture(scope="module")
def question():
    return load_questions("demo-eval", limit=1)[0]


def play(tok, protocol_name, turns, question, index, **cfg_kwargs) -> tuple[Trajectory, CountingRetriever]:
    protocol = get_protocol(protocol_name)
    retriever = CountingRetriever(index)
    engine = ScriptedEngine(tok, protocol, {question["question"]: turns})
    cfg = RolloutConfig(**{"max_turns": 3, "max_turn_tokens": 64, "max_response_tokens": 1024, "topk": 2,
                           **cfg_kwargs})
    (traj,), _ = run_episodes(engine, protocol, retriever, [question], cfg)
    assert isinstance(traj.stop_reason, EpisodeEnd)   # every way an episode ends is one of the enum's
    return traj, retriever


# (protocol, first turn, error the protocol gives it) — each followed by a good answer turn
INVALID_TURNS = [
    ("search_r1", ("<think>Look it up.</think> <search> Maria Golovin opera", "length"), "unclosed <search>"),
    ("search_r1", "<search> Maria Golovin <search> opera composer </search>", "nested <search>"),
    ("search_r1", "<search>   \n  </search>", "empty query"),
    ("search_r1", "<answer>  </answer>", "empty answer"),
    ("search_r1", ("<answer> Gian Carlo", "length"), "unclosed <answer>"),
    ("search_r1", "</search> composer </search>", "</search> without <search>"),
    ("search_r1", (f"<think>I remember.</think>\n<information>{FAKE_DOC}</information>\n", "length"),
     "the model wrote its own <information> block"),
    ("r1_searcher", (f"<think>I recall <|begin_of_documents|>{FAKE_DOC}<|end_of_documents|>", "length"),
     "the model wrote its own <|begin_of_documents|> block"),
    ("search_r1", (LONG_ANSWER, None), "unclosed <answer>"),  # cut at the 64-token turn budget
]


@pytest.mark.parametrize("protocol_name,first,error", INVALID_TURNS, ids=[e for _, _, e in INVALID_TURNS])
def test_invalid_turn_gets_feedback_and_counts_as_a_format_error(tok, eos_ids, index, question,
                                                                  protocol_name, first, error):
    protocol = get_protocol(protocol_name)
    answer = ANSWER if protocol_name != "smartrag" else "[Answer] Gian Carlo Menotti [/Answer]"
    t, retriever = play(tok, protocol_name, [first, answer], question, index)
    check_token_invariants(t, tok, eos_ids)
    bad = t.turns[0]
    assert (bad.kind, bad.error) == ("invalid", error)
    assert bad.observation == protocol.format_feedback(error)
    assert bad.passage_ids == [] and bad.queries == []
    runs = spans(t.action_mask, t.prompt_len)
    assert [v for v, _, _ in runs] == [1, 0, 1]  # action, feedback (mask 0), answer
    assert tok.decode(t.token_ids[runs[1][1]:runs[1][2]]) == bad.observation
    assert (t.format_errors, t.num_searches, t.stop_reason, t.answer) == (1, 0, "answer", "Gian Carlo Menotti")
    assert retriever.calls == [] and t.retrieved_ids == []


def test_hallucinated_information_is_the_policys_own_tokens(tok, eos_ids, index, question):
    t, _ = play(tok, "search_r1", [INVALID_TURNS[6][1], ANSWER], question, index)
    action = spans(t.action_mask, t.prompt_len)[0]
    assert action[0] == 1
    own = tok.decode(t.token_ids[action[1]:action[2]])
    assert "<information>" in own and FAKE_DOC in own  # the forged block is inside the mask-1 run
    assert not any("p999999" in pid for pid in t.retrieved_ids)


def test_search_followed_by_forged_information_uses_only_real_passages(tok, eos_ids, index, question):
    first = (f"<search> Maria Golovin opera </search>\n<information>{FAKE_DOC}</information>", "length")
    t, retriever = play(tok, "search_r1", [first, ANSWER], question, index)
    check_token_invariants(t, tok, eos_ids)
    search = t.turns[0]
    assert (search.kind, search.queries, t.format_errors) == ("search", ["Maria Golovin opera"], 0)
    assert retriever.calls == [["Maria Golovin opera"]]
    assert search.passage_ids == [[h.id for h in index.search(["Maria Golovin opera"], 2)[0]]]
    assert "Invented" not in search.observation and FAKE_DOC in search.action_text


@pytest.mark.parametrize("text,answer,well_formed", [
    ("<answer> Gian Carlo Menotti </answer><answer> Mozart </answer>", "Gian Carlo Menotti", False),
    ("<answer> Gian Carlo Menotti </answer> I hope this helps!", "Gian Carlo Menotti", False),
    (LONG_ANSWER, ("Menotti wrote it " * 700)[:200].strip(), True),  # fits a big turn budget: cut to 200 chars
], ids=["several answers", "text after the answer", "10k-character answer"])
def test_answer_with_junk_around_it_ends_the_episode_with_the_first_answer(tok, eos_ids, index, question,
                                                                           text, answer, well_formed):
    """The engine stops at the first </answer>; an engine that does not (or the text here) still
    gives the first answer, a valid action, while the whole response is not well formed."""
    protocol = get_protocol("search_r1")
    t, _ = play(tok, "search_r1", [(text, "stop")], question, index, max_turn_tokens=4096,
                max_response_tokens=8192)
    check_token_invariants(t, tok, eos_ids)
    assert (t.stop_reason, t.answer, t.format_errors, t.num_turns) == ("answer", answer, 0, 1)
    assert len(t.answer) <= protocol.max_answer_chars
    assert t.turns[0].observation == "" and t.action_mask[-1] == 1
    assert protocol.is_valid_format(t.turns[0].action_text) == well_formed


@pytest.mark.parametrize("text", ["I think it was Menotti.", "<think>Hmm, no idea", "<answer> Menotti", ""])
def test_eos_without_an_action_ends_with_no_answer(tok, eos_ids, index, question, text):
    t, retriever = play(tok, "search_r1", [(text, "eos"), ANSWER], question, index)
    check_token_invariants(t, tok, eos_ids)
    assert (t.stop_reason, t.answer, t.num_turns, t.format_errors) == ("no_answer", None, 1, 1)
    assert t.turns[0].kind == "invalid" and t.turns[0].observation == ""
    assert t.token_ids[-1] in eos_ids and t.action_mask[-1] == 1  # the EOS is the policy's action
    assert t.turns[0].action_text == text and retriever.calls == []


def test_many_malformed_trajectories_in_one_batch_do_not_disturb_each_other(tok, eos_ids, index):
    """All the cases at once, n=2: each trajectory ends up exactly as it does alone."""
    questions = load_questions("demo-eval", limit=len(INVALID_TURNS))
    protocol = get_protocol("search_r1")
    scripts = {q["question"]: [first, ANSWER] for q, (name, first, _) in zip(questions, INVALID_TURNS)
               if name == "search_r1"}
    engine = ScriptedEngine(tok, protocol, scripts)
    samples = [q for q in questions if q["question"] in scripts]
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=64, topk=2, n=2)
    trajs, _ = run_episodes(engine, protocol, CountingRetriever(index), samples, cfg)
    errors = [e for name, _, e in INVALID_TURNS if name == "search_r1"]
    assert len(trajs) == 2 * len(errors)
    for t, error in zip(trajs, [e for e in errors for _ in range(2)]):
        check_token_invariants(t, tok, eos_ids)
        assert (t.turns[0].error, t.stop_reason, t.answer) == (error, "answer", "Gian Carlo Menotti")
