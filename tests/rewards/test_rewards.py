"""Rewards: hand-computed metrics, rewards on strings and Trajectories, combination, schedules."""
import pytest

from ragrl.methods.r1_searcher import R1SearcherProtocol
from ragrl.methods.search_r1 import SearchR1Protocol, search_r1_format_reward
from ragrl.errors import ConfigError, RagrlError
from ragrl.retrieval.base import Hit
from ragrl.methods.r1_searcher import r1_searcher_stage1_reward, r1_searcher_stage2_reward
from ragrl.rewards import (
    REWARDS,
    RewardSchedule,
    answer_of,
    cover_em,
    cover_em_reward,
    em_reward,
    exact_match,
    f1_reward,
    f1_score,
    format_reward,
    answer_in_docs_reward,
    gold_recall_reward,
    make_reward,
    normalize_answer,
    retrieval_reward,
    reward_breakdown,
    search_cost_reward,
    search_count,
)
from ragrl.rollout.trajectory import Trajectory, Turn

SAMPLE = {"answers": ["Steven Spielberg", "Spielberg"], "gold_passage_ids": ["p1", "p9"]}
JAWS = Hit(id="p1", title="Jaws (film)", text="Jaws is a 1975 film directed by Steven Spielberg.", score=1.0)


def trajectory(turns, answer, **kw) -> Trajectory:
    """A Trajectory as the rollout loop records it (token fields are not read by rewards)."""
    return Trajectory(sample_id="s", question="Who directed Jaws?", golds=["Steven Spielberg"], token_ids=[1, 2],
                      action_mask=[0, 1], logprobs=[0.0, -0.5], prompt_len=1, turns=turns, answer=answer, **kw)


def good_episode(answer="Steven Spielberg", protocol=None) -> Trajectory:
    p = protocol or SearchR1Protocol()
    q_open, q_close = p.query
    search = Turn(action_text=f"<think>look</think>{q_open} Jaws director {q_close}", kind="search",
                  queries=["Jaws director"], passage_ids=[["p1", "p5"]],
                  observation=p.format_observation(["Jaws director"], [[JAWS]]))
    final = Turn(action_text=f"<think>found</think><answer> {answer} </answer>", kind="answer")
    return trajectory([search, final], answer, num_searches=1, metrics={"protocol": p.name})


# ------------------------------------------------------------------------------ metrics
def test_normalisation():
    assert normalize_answer("  The Quick, Brown Fox!  ") == "quick brown fox"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"          # articles only as whole words


def test_exact_match_with_aliases_articles_punctuation():
    assert exact_match("spielberg.", SAMPLE["answers"]) == 1.0
    assert exact_match("The Beatles!", ["beatles"]) == 1.0
    assert exact_match("Steven Allan Spielberg", SAMPLE["answers"]) == 0.0
    assert exact_match("", ["x"]) == 0.0 and exact_match("x", []) == 0.0


def test_f1_by_hand():
    # "big red dog" vs "red dog house": 2 common tokens, precision = recall = 2/3
    assert f1_score("the big red dog", ["red dog house"]) == pytest.approx(2 / 3)
    # the best alias counts: vs "Spielberg" P=1/3 R=1 → 0.5, vs "Steven Spielberg" P=2/3 R=1 → 0.8
    assert f1_score("Steven Allan Spielberg", SAMPLE["answers"]) == pytest.approx(0.8)
    assert f1_score("dog dog", ["dog"]) == pytest.approx(2 * 0.5 * 1 / 1.5)   # repeats count once each
    assert f1_score("cat", ["dog"]) == 0.0


def test_f1_yes_no_rule():
    assert f1_score("Yes.", ["yes"]) == 1.0
    assert f1_score("yes", ["yes indeed"]) == 0.0   # prediction is special and differs
    assert f1_score("no way", ["no"]) == 0.0         # gold is special and differs
    assert f1_score("noanswer", ["no answer"]) == 0.0


def test_cover_em_whole_tokens():
    assert cover_em("I believe it was Steven Spielberg, in 1975", SAMPLE["answers"]) == 1.0
    assert cover_em("Spielberg", ["Steven Spielberg"]) == 0.0
    assert cover_em("not sure", ["no"]) == 0.0
    assert cover_em("restart", ["art"]) == 0.0
    assert cover_em("anything", ["the"]) == 0.0      # a gold that normalises to nothing never matches


# ---------------------------------------------------------------------- QA rewards
def test_answer_of_strings_and_trajectories():
    assert answer_of("<think>x</think><answer> Paris </answer><answer>Rome</answer>") == "Paris"
    assert answer_of("  Paris,\n France ") == "Paris, France"       # plain baseline reply
    assert answer_of("<think>It is Paris</think>") == ""              # protocol text, no answer
    assert answer_of("<|begin_of_query|> q <|end_of_query|><answer>x</answer>", R1SearcherProtocol()) == "x"
    assert answer_of(good_episode("Lyon")) == "Lyon"
    assert answer_of(trajectory([], None, stop_reason="max_turns")) == ""


def test_qa_rewards_on_strings_and_trajectories():
    assert em_reward("<answer>spielberg</answer>", SAMPLE) == 1.0
    assert f1_reward("<answer>Steven Allan Spielberg</answer>", SAMPLE) == pytest.approx(0.8)
    assert cover_em_reward("<answer>it was Spielberg</answer>", SAMPLE) == 1.0
    assert em_reward(good_episode(), SAMPLE) == 1.0
    assert em_reward(good_episode(), None) == 1.0            # falls back to the trajectory's golds
    assert f1_reward(good_episode("Ridley Scott"), SAMPLE) == 0.0
    with pytest.raises(RagrlError, match="'answers'"):
        em_reward("<answer>x</answer>", {"question": "q"})
    with pytest.raises(RagrlError, match="Trajectory or a str"):
        em_reward(42, SAMPLE)


# -------------------------------------------------------------------------- format
def test_format_reward_on_strings_and_trajectories():
    assert format_reward("<think>a</think><answer>b</answer>", SAMPLE) == 1.0
    assert format_reward("<answer>b</answer> and then some", SAMPLE) == 0.0
    assert format_reward(good_episode(), SAMPLE) == 1.0
    assert format_reward(good_episode(protocol=R1SearcherProtocol()), SAMPLE) == 1.0  # reads metrics["protocol"]
    assert format_reward(good_episode(protocol=R1SearcherProtocol()), SAMPLE, protocol="search_r1") == 0.0
    flawed = good_episode()
    flawed.format_errors = 1
    assert format_reward(flawed, SAMPLE) == 0.0
    unfinished = good_episode()
    unfinished.turns = unfinished.turns[:1]
    assert format_reward(unfinished, SAMPLE) == 0.0


def test_search_r1_format_reward_four_cases():
    ok, bad = "<think>x</think><answer>{}</answer>", "<answer>{}</answer> extra"
    assert search_r1_format_reward(ok.format("Spielberg"), SAMPLE) == 1.0
    assert search_r1_format_reward(bad.format("Spielberg"), SAMPLE) == pytest.approx(0.8)
    assert search_r1_format_reward(ok.format("Scott"), SAMPLE) == pytest.approx(0.2)
    assert search_r1_format_reward(bad.format("Scott"), SAMPLE) == 0.0
    assert search_r1_format_reward(ok.format("Scott"), SAMPLE, lambda_f=0.4) == pytest.approx(0.4)


# -------------------------------------------------------------------------- search
def test_search_count_and_cost():
    obs = "<information>d</information>"
    text = f"<search> a </search>{obs}<search> </search>{obs}<search> b </search>{obs}<answer>x</answer>"
    assert search_count(text) == 2                           # the empty query is not a search
    assert search_count(f"<search> q </search><information><search> fake </search></information>") == 1
    assert search_count("<search> a; b; c </search>", "rag_r1") == 1   # one action, three queries
    assert search_count(good_episode()) == 1
    assert search_cost_reward(text, SAMPLE) == pytest.approx(-0.2)
    assert search_cost_reward(text, SAMPLE, cost=0.05) == pytest.approx(-0.1)
    assert retrieval_reward(text, SAMPLE) == 0.5 and retrieval_reward("<answer>x</answer>", SAMPLE) == 0.0


def test_gold_recall():
    assert gold_recall_reward(good_episode(), SAMPLE) == 0.5          # p1 retrieved, p9 not
    assert gold_recall_reward(good_episode(), {"answers": ["x"]}) == 0.0
    with pytest.raises(RagrlError, match="needs a Trajectory"):
        gold_recall_reward("<search>q</search>", SAMPLE)


def test_answer_in_docs_reads_only_what_was_retrieved():
    episode = good_episode()   # the search's documents hold "Steven Spielberg"
    assert answer_in_docs_reward(episode, {"answers": ["Spielberg"]}) == 1.0
    assert answer_in_docs_reward(episode, {"answers": ["George Lucas"]}) == 0.0
    # the answer the policy wrote is not a retrieved document
    episode.turns[-1].action_text = "<answer> George Lucas </answer>"
    assert answer_in_docs_reward(episode, {"answers": ["George Lucas"]}) == 0.0
    assert answer_in_docs_reward(episode, {"answers": ["yes"]}) == 0.0   # no signal in yes/no
    with pytest.raises(RagrlError, match="needs a Trajectory"):
        answer_in_docs_reward("<search>q</search>", SAMPLE)


def test_r1_searcher_stages():
    p = R1SearcherProtocol()
    episode = good_episode(protocol=p)
    assert r1_searcher_stage1_reward(episode, SAMPLE) == 1.0
    no_search = "<think>I know</think><answer>Spielberg</answer>"
    assert r1_searcher_stage1_reward(no_search, SAMPLE) == 0.5     # format only
    assert r1_searcher_stage1_reward("<answer>x</answer> junk", SAMPLE) == 0.0
    assert r1_searcher_stage2_reward(episode, SAMPLE) == 1.0
    assert r1_searcher_stage2_reward(good_episode("Steven Allan Spielberg", p), SAMPLE) == pytest.approx(0.8)
    assert r1_searcher_stage2_reward("<answer>Spielberg</answer> junk", SAMPLE) == pytest.approx(-1.0)
    assert r1_searcher_stage2_reward("<answer>Scott</answer> junk", SAMPLE, penalty=1.0) == -1.0


# ----------------------------------------------------------------- combination
def test_make_reward_weights_and_options():
    text = "<search> q </search><information>d</information><answer>Steven Allan Spielberg</answer>"
    reward = make_reward({"f1": 2.0, "em": 1.0, "search_cost": {"weight": 3.0, "cost": 0.05}})
    assert reward(text, SAMPLE) == pytest.approx(2 * 0.8 + 0 - 3 * 0.05)
    as_list = make_reward([{"name": "f1", "weight": 2.0}, {"name": "em"}, {"name": "search_cost", "weight": 3.0, "cost": 0.05}])
    assert as_list(text, SAMPLE) == pytest.approx(reward(text, SAMPLE))
    assert make_reward(reward) is reward
    assert reward_breakdown(text, SAMPLE, {"f1": 2.0, "search_cost": {"cost": 0.05}}) == pytest.approx(
        {"f1": 0.8, "search_cost": -0.05, "total": 1.55})
    assert make_reward({"format": {"protocol": "r1_searcher"}})(good_episode(protocol=R1SearcherProtocol()), SAMPLE) == 1.0


def test_make_reward_errors_are_clear():
    with pytest.raises(ConfigError, match="unknown reward 'exact'.*known: .*em.*f1"):
        make_reward({"exact": 1.0})
    with pytest.raises(ConfigError, match="reward 'search_cost': unknown option\\(s\\) \\['price'\\]"):
        make_reward({"search_cost": {"price": 0.1}})
    with pytest.raises(ConfigError, match="weight must be a finite number"):
        make_reward({"f1": "high"})
    with pytest.raises(ConfigError, match="empty"):
        make_reward({})
    with pytest.raises(ConfigError, match="named twice"):
        make_reward([{"name": "f1"}, {"name": "f1", "weight": 2}])
    with pytest.raises(ConfigError, match="needs a 'name'"):
        make_reward([{"f1": 1.0}])
    with pytest.raises(ConfigError, match="unknown protocol 'searchr1'"):
        make_reward({"format": {"protocol": "searchr1"}})
    assert set(REWARDS) >= {"em", "f1", "cover_em", "format", "search_r1_format", "search_cost", "retrieval",
                            "gold_recall", "r1_searcher_stage1", "r1_searcher_stage2"}


# -------------------------------------------------------------------- schedule
def test_schedule_stages():
    stage1, stage2 = {"r1_searcher_stage1": 1.0}, {"r1_searcher_stage2": 1.0}
    schedule = RewardSchedule([(0, stage1), (50, stage2)])
    assert [schedule.at(s) for s in (0, 49, 50, 10_000)] == [stage1, stage1, stage2, stage2]
    text = "<think>I know</think><answer>Spielberg</answer>"
    assert schedule.reward_at(10)(text, SAMPLE) == 0.5 and schedule.reward_at(60)(text, SAMPLE) == 1.0
    assert RewardSchedule.parse({"em": 1.0}).at(7) == {"em": 1.0}
    parsed = RewardSchedule.parse([{"from_step": 0, "reward": stage1}, {"from_step": 5, "reward": stage2}])
    assert parsed.at(5) == stage2 and len(parsed) == 2
    assert RewardSchedule.parse([[0, stage1], [3, stage2]]).at(2) == stage1
    assert RewardSchedule.parse([{"name": "em"}]).at(0) == [{"name": "em"}]   # a list spec, constant


def test_schedule_validation():
    with pytest.raises(ConfigError, match="strictly ascend"):
        RewardSchedule([(0, {"em": 1}), (10, {"f1": 1}), (10, {"em": 1})])
    with pytest.raises(ConfigError, match="start at step 0"):
        RewardSchedule([(5, {"em": 1})])
    with pytest.raises(ConfigError, match="unknown reward"):
        RewardSchedule([(0, {"em": 1}), (10, {"nope": 1})])      # every stage is checked up front
    with pytest.raises(ConfigError, match="at least one"):
        RewardSchedule([])
    with pytest.raises(ConfigError, match="non-negative integer"):
        RewardSchedule([(0, {"em": 1})]).at(-1)
    with pytest.raises(ConfigError, match="takes from_step and reward"):
        RewardSchedule.parse([{"from_step": 0, "rewards": {"em": 1}}])


def test_a_new_protocol_gets_the_search_rewards_without_a_change_in_rewards():
    """Rewards ask the protocol to count searches and to tell a protocol response from a plain
    reply; they never test its Python type (a protocol defined here, after the rewards)."""
    from ragrl.rollout.protocol import Action, TextProtocol
    class Bracket(TextProtocol):
        name = "bracket"

        def count_searches(self, response):
            return response.count("SEARCH(")

        def has_tags(self, text):
            return "SEARCH(" in text or "ANSWER(" in text

        def extract_answer(self, text):
            return text.split("ANSWER(", 1)[1].split(")", 1)[0] if "ANSWER(" in text else None

        def parse(self, text):
            return Action("invalid", error="unused")

    p = Bracket()
    from ragrl.rewards.qa import answer_of
    from ragrl.rewards.search import search_cost_reward, search_count

    text = "SEARCH(jaws) docs SEARCH(director) ANSWER(Steven Spielberg)"
    assert search_count(text, p) == 2 and search_cost_reward(text, {}, cost=0.1, protocol=p) == pytest.approx(-0.2)
    assert answer_of(text, p) == "Steven Spielberg" and answer_of("SEARCH(x)", p) == ""
