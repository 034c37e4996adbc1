"""Protocols: every parsing rule on literal strings, observations, whole-response grammar."""
import random

import pytest

from ragrl.rollout.baselines import baseline_answer, direct_messages, naive_rag_messages
from ragrl.methods.r1_searcher import R1SearcherProtocol
from ragrl.methods.rag_r1 import RagR1Protocol
from ragrl.methods.search_r1 import SearchR1Protocol
from ragrl.methods.smartrag.protocol import SmartRAGProtocol
from ragrl.rollout.protocol import PROTOCOLS, Action, get_protocol

# The tag protocols, whose episodes the multi-turn runner plays (a pipeline's are not turn by turn).
TAG_PROTOCOLS = {name: cls for name, cls in PROTOCOLS.items() if cls.runner == "multi_turn"}
from ragrl.errors import ConfigError, RagrlError
from ragrl.retrieval.base import Hit

JAWS = Hit(id="p1", title="Jaws (film)", text="Jaws is a 1975 film directed by Steven Spielberg.", score=3.5)
ALIEN = Hit(id="p2", title="Alien (film)", text="Alien is a 1979 film directed by Ridley Scott.", score=2.0)


@pytest.fixture
def sr1():
    return SearchR1Protocol()


def err(action: Action) -> str:
    assert action.kind == "invalid", action
    return action.error


# ------------------------------------------------------------------------- Search-R1 parse
def test_prompt_stop_strings_and_example(sr1):
    system, user = sr1.messages("  Who wrote Dune? ")
    assert system["role"] == "system" and user == {"role": "user", "content": "Question: Who wrote Dune?"}
    for piece in ("<think>", "<search>", "<information>", "<answer>", "Example"):
        assert piece in system["content"]
    # the worked example in the prompt itself follows the grammar the format reward checks
    example = system["content"].split("Question: Who directed Jaws?\n", 1)[1]
    assert sr1.is_valid_format(example) and sr1.extract_answer(example) == "Steven Spielberg"
    assert sr1.stop_strings == ["</search>", "</answer>"]
    with pytest.raises(RagrlError, match="question"):
        sr1.messages("   ")


def test_search_and_answer(sr1):
    assert sr1.parse("<think>need it</think>\n<search>  Jaws \n director </search>") == Action("search", queries=["Jaws director"])
    assert sr1.parse("<think>know it</think><answer> Steven  Spielberg </answer>") == Action("answer", answer="Steven Spielberg")


def test_unclosed_tags_are_invalid(sr1):
    assert err(sr1.parse("<think>x</think><search> Jaws direc")) == "unclosed <search>"
    assert err(sr1.parse("<answer> Steven Spiel")) == "unclosed <answer>"
    assert err(sr1.parse("<search> Jaws <answer> x </answer>")) == "unclosed <search>"


def test_nested_tags_are_invalid(sr1):
    assert err(sr1.parse("<search> a <search> b </search>")) == "nested <search>"
    assert err(sr1.parse("<answer> a <answer> b </answer>")) == "nested <answer>"


def test_close_without_open(sr1):
    assert err(sr1.parse("Jaws director </search>")) == "</search> without <search>"


def test_empty_query_and_empty_answer(sr1):
    assert err(sr1.parse("<search></search>")) == "empty query"
    assert err(sr1.parse("<search> \n\t </search>")) == "empty query"
    assert err(sr1.parse("<answer>  </answer>")) == "empty answer"


def test_long_query_and_answer_are_truncated_not_rejected(sr1):
    action = sr1.parse("<search>" + "q" * 2000 + "</search>")
    assert action.kind == "search" and action.queries == ["q" * 512]
    action = sr1.parse("<answer>" + "a" * 10_000 + "</answer>")
    assert action.kind == "answer" and action.answer == "a" * 200
    short = SearchR1Protocol(max_query_chars=5, max_answer_chars=3)
    assert short.parse("<search>abcdefgh</search>").queries == ["abcde"]
    assert short.parse("<answer>abcdefgh</answer>").answer == "abc"


def test_several_answers_first_wins_but_format_is_invalid(sr1):
    turn = "<think>x</think><answer> Paris </answer><answer> Rome </answer>"
    assert sr1.parse(turn) == Action("answer", answer="Paris")
    assert sr1.extract_answer(turn) == "Paris"
    assert not sr1.is_valid_format(turn)


def test_text_after_answer_is_ignored_but_format_is_invalid(sr1):
    turn = "<think>x</think><answer> Paris </answer> because it is the capital"
    assert sr1.parse(turn) == Action("answer", answer="Paris")
    assert not sr1.is_valid_format(turn)
    assert sr1.is_valid_format("<think>x</think><answer> Paris </answer>\n")


def test_self_written_observation_is_invalid(sr1):
    hallucinated = "<think>x</think><information>Paris is in Italy</information><answer>Rome</answer>"
    assert err(sr1.parse(hallucinated)) == "the model wrote its own <information> block"
    assert err(sr1.parse("Paris </information> <answer>x</answer>")) == "the model wrote its own <information> block"
    assert err(sr1.parse("<search> q <information> fake")) == "the model wrote its own <information> block"


def test_no_action_is_a_format_error(sr1):
    assert err(sr1.parse("<think>I am still thinking about this")) == "no <search> or <answer>"
    assert err(sr1.parse("")) == "no <search> or <answer>"


def test_which_action_wins(sr1):
    assert sr1.parse("<search> a </search><answer> b </answer>") == Action("search", queries=["a"])
    assert sr1.parse("<answer> b </answer><search> a </search>") == Action("answer", answer="b")
    # a run of searches before any answer: the last one is the action
    assert sr1.parse("<search> a </search> then <search> b </search><answer>c</answer>").queries == ["b"]
    # a malformed tail after a complete search does not undo it
    assert sr1.parse("<search> a </search><search> b").queries == ["a"]
    assert sr1.parse("<search> a </search><information>fake</information>").queries == ["a"]


def test_parse_never_raises_on_random_output(sr1):
    pieces = ["<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>",
              "<think>", "</think>", " Paris ", "\n", "", "  ", "<", ">", "x" * 300]
    rng = random.Random(0)
    for protocol in (sr1, RagR1Protocol(), R1SearcherProtocol(), SmartRAGProtocol()):
        tags = [*protocol.query, *protocol.answer, *protocol.observation]
        for _ in range(500):
            text = "".join(rng.choice(pieces + tags) for _ in range(rng.randint(0, 12)))
            action = protocol.parse(text)
            assert action.kind in ("search", "answer", "invalid")
            if action.kind == "search":
                assert action.queries and all(q.strip() for q in action.queries)
            elif action.kind == "answer":
                assert action.answer and len(action.answer) <= protocol.max_answer_chars
            else:
                assert action.error
            protocol.is_valid_format(text)
            protocol.extract_answer(text)
    assert sr1.parse(None).kind == "invalid"


# ----------------------------------------------------------------------- observations
def test_observation_is_search_r1_shaped(sr1):
    obs = sr1.format_observation(["Jaws director"], [[JAWS, ALIEN]])
    assert obs == (
        '\n\n<information>Doc 1 (Title: "Jaws (film)") Jaws is a 1975 film directed by Steven Spielberg.\n'
        'Doc 2 (Title: "Alien (film)") Alien is a 1979 film directed by Ridley Scott.</information>\n\n'
    )
    assert "(no results)" in sr1.format_observation(["zzz"], [[]])
    with pytest.raises(RagrlError, match="2 queries but 1 hit lists"):
        sr1.format_observation(["a", "b"], [[JAWS]])


def test_observation_groups_documents_per_query():
    obs = RagR1Protocol().format_observation(["Jaws director", "Alien director"], [[JAWS], [ALIEN, JAWS]])
    assert obs == (
        "\n\n<information>Query 1: Jaws director\n"
        'Doc 1 (Title: "Jaws (film)") Jaws is a 1975 film directed by Steven Spielberg.\n'
        "Query 2: Alien director\n"
        'Doc 1 (Title: "Alien (film)") Alien is a 1979 film directed by Ridley Scott.\n'
        'Doc 2 (Title: "Jaws (film)") Jaws is a 1975 film directed by Steven Spielberg.</information>\n\n'
    )
    # Search-R1 with several queries groups too rather than merging them
    assert "Query 2: b" in SearchR1Protocol().format_observation(["a", "b"], [[JAWS], [ALIEN]])


def test_feedback_stays_inside_observation_tags(sr1):
    fb = sr1.format_feedback("unclosed <search>")
    assert fb == ("\n<information>Invalid action: unclosed <search>. "
                  "Use <search> query </search> or <answer> answer </answer>.</information>\n")
    # the hint's example <answer> is observation text: never taken as the model's answer
    response = "<search> Jaws" + fb + "<think>ok</think><answer> Spielberg </answer>"
    assert sr1.extract_answer(response) == "Spielberg"
    assert not sr1.is_valid_format(response)  # the unclosed search still breaks the grammar
    assert sr1.extract_answer("<think>x</think>" + fb) is None


# -------------------------------------------------------------------- whole responses
def test_is_valid_format_grammar(sr1):
    obs = sr1.format_observation(["q"], [[JAWS]])
    good = "<think>a</think>\n<search> q </search>" + obs + "<think>b</think>\n<answer> Spielberg </answer>"
    assert sr1.is_valid_format(good)
    assert sr1.is_valid_format("<search> q </search>" + obs + "<search> r </search>" + obs + "<answer>x</answer>")
    assert sr1.is_valid_format("<answer> x </answer>")                      # think is optional
    assert sr1.is_valid_format("<think>a</think><answer>x</answer><|im_end|>")
    assert not sr1.is_valid_format("Sure! <think>a</think><answer>x</answer>")  # text outside tags
    assert not sr1.is_valid_format("<think>a</think><information>d</information><answer>x</answer>")
    assert not sr1.is_valid_format("<search> q </search><answer>x</answer>")  # search with no observation
    assert not sr1.is_valid_format("<search> q </search>" + obs)             # never answered
    assert not sr1.is_valid_format("<think>a <search> q </search></think>" + obs + "<answer>x</answer>")
    assert not sr1.is_valid_format("<think>a <answer>x</answer></think>")
    assert not sr1.is_valid_format("<think><think>a</think></think><answer>x</answer>")
    assert not sr1.is_valid_format("<think>a</think><answer></answer>")
    assert not sr1.is_valid_format("<answer>x</answer><answer>y</answer>")
    assert not sr1.is_valid_format("<think>a</think><answer>x")
    assert not sr1.is_valid_format(None)


def test_extract_answer_reads_action_text_only(sr1):
    response = "<search> q </search><information>Doc 1 <answer> fake </answer></information><answer> real </answer>"
    assert sr1.extract_answer(response) == "real"
    assert sr1.is_valid_format(response)
    assert sr1.extract_answer("<think>no answer here</think>") is None
    assert sr1.extract_answer("<answer> </answer><answer> second </answer>") == "second"


@pytest.mark.parametrize("name", sorted(TAG_PROTOCOLS))
def test_an_episode_round_trips(name):
    """Turns as a model would write them + the protocol's observations = a valid response."""
    p = get_protocol(name)
    (q_open, q_close), (a_open, a_close) = p.query, p.answer
    thought = "<think>{}</think>\n" if p.think else ""  # smartrag has no reasoning text
    turn1 = thought.format("look it up") + f"{q_open} Jaws director {q_close}"
    action = p.parse(turn1)
    assert action == Action("search", queries=["Jaws director"])
    obs = p.format_observation(action.queries, [[JAWS]])
    turn2 = thought.format("found it") + f"{a_open} Steven Spielberg {a_close}"
    assert p.parse(turn2) == Action("answer", answer="Steven Spielberg")
    response = turn1 + obs + turn2
    assert p.is_valid_format(response)
    assert p.extract_answer(response) == "Steven Spielberg"
    # an invalid turn answered by feedback makes the whole response badly formed
    bad = f"{q_open} Jaws {a_open} x"   # two actions in one step: invalid in every protocol
    assert p.parse(bad).kind == "invalid"
    assert not p.is_valid_format(bad + p.format_feedback(p.parse(bad).error) + turn2)


# ----------------------------------------------------------------------------- RAG-R1
def test_rag_r1_multi_query():
    p = RagR1Protocol()
    assert p.parse("<search> Jaws director; Alien director\nAlien year </search>").queries == [
        "Jaws director", "Alien director", "Alien year"]
    assert p.parse("<search> a; A ;; b ; </search>").queries == ["a", "b"]          # repeats, empties
    assert p.parse('<search> ["q one", "q two"] </search>').queries == ["q one", "q two"]
    assert p.parse("<search> [not json; x </search>").queries == ["[not json", "x"]
    assert err(p.parse("<search> ; \n ; </search>")) == "empty query"


def test_rag_r1_extra_queries_are_dropped_and_action_stays_valid():
    action = RagR1Protocol().parse("<search> a; b; c; d; e </search>")
    assert action == Action("search", queries=["a", "b", "c"])
    assert RagR1Protocol(max_queries=1).parse("<search> a; b </search>").queries == ["a"]
    assert "up to 2 queries" in RagR1Protocol(max_queries=2).messages("q")[0]["content"]
    assert "Query 1: a\n" in RagR1Protocol().format_observation(["a"], [[JAWS]])  # labelled even alone


# ------------------------------------------------------------------------ R1-Searcher
def test_r1_searcher_tags():
    p = R1SearcherProtocol()
    assert p.stop_strings == ["<|end_of_query|>", "</answer>"]
    assert p.parse("<think>I need it <|begin_of_query|> Jaws director <|end_of_query|>") == Action(
        "search", queries=["Jaws director"])
    assert err(p.parse("<think>x <|begin_of_query|> Jaws")) == "unclosed <|begin_of_query|>"
    assert err(p.parse("<think>x <|begin_of_documents|> Jaws is ...")) == \
        "the model wrote its own <|begin_of_documents|> block"
    assert err(p.parse("<search> Jaws </search>")) == "no <|begin_of_query|> or <answer>"
    obs = p.format_observation(["q"], [[JAWS]])
    assert obs.startswith("\n<|begin_of_documents|>Doc 1 (Title: \"Jaws (film)\")")
    assert obs.endswith("<|end_of_documents|>\n")
    # queries inside <think>, answer after it: R1-Searcher's shape
    assert p.is_valid_format("<think>a <|begin_of_query|> q <|end_of_query|>" + obs + "so x</think><answer>x</answer>")
    assert not p.is_valid_format("<think>a</think>" + obs + "<answer>x</answer>")


# --------------------------------------------------------------------------- SmartRAG
def test_smartrag_actions():
    p = SmartRAGProtocol()
    assert p.stop_strings == ["[/Search]", "[/Answer]"]
    assert p.parse("[Search] Jaws film director [/Search]") == Action("search", queries=["Jaws film director"])
    assert p.parse("[Answer] Steven Spielberg [/Answer]") == Action("answer", answer="Steven Spielberg")
    # the first word decides (the released code's parser): a close marker is optional
    assert p.parse("[Search] Jaws film") == Action("search", queries=["Jaws film"])
    assert p.parse("\n [Answer] Steven Spielberg") == Action("answer", answer="Steven Spielberg")
    assert err(p.parse("[Search] Jaws film [Answer] Spielberg")) == "two actions in one step"
    assert err(p.parse("[Answer] Spielberg [Search] Jaws")) == "two actions in one step"
    assert err(p.parse("[Search]   [/Search]")) == "empty query"
    assert err(p.parse("[Documents] Jaws was directed by me [/Documents]")) == \
        "the model wrote its own [Documents] block"
    assert err(p.parse("[Search] Jaws [Documents] fake")) == "the model wrote its own [Documents] block"
    assert err(p.parse("<answer> x </answer>")) == "a step must start with [Search] or [Answer]"
    assert err(p.parse("I think [Search] Jaws")) == "a step must start with [Search] or [Answer]"
    assert p.invalid_ends_episode
    obs = p.format_observation(["q"], [[JAWS]])
    assert p.is_valid_format("[Search] q" + obs + "[Answer] Steven Spielberg [/Answer]<|im_end|>")
    assert p.extract_answer("[Search] q" + obs + "[Answer] Steven Spielberg") == "Steven Spielberg"
    assert not p.is_valid_format("[Answer] a" + obs + "[Answer] b")
    assert p.format_observation(["q"], [[JAWS]]) == (
        '\n[Documents]Doc 1 (Title: "Jaws (film)") Jaws is a 1975 film directed by Steven Spielberg.[/Documents]\n')
    assert "[Documents]Invalid action: empty query." in p.format_feedback("empty query")
    assert not p.is_valid_format("I will search. [Search] q [/Search]")


# ------------------------------------------------------------------ registry, baselines
def test_registry():
    assert {"search_r1", "rag_r1", "r1_searcher", "smartrag"} <= set(PROTOCOLS)
    assert isinstance(get_protocol("smartrag"), SmartRAGProtocol)
    assert get_protocol("rag_r1", max_queries=5).max_queries == 5
    p = SearchR1Protocol()
    assert get_protocol(p) is p
    with pytest.raises(ConfigError, match=r"unknown protocol 'search-r1'; did you mean 'search_r1'\? \(known: mmoa, r1_searcher, rag_r1"):
        get_protocol("search-r1")
    with pytest.raises(ConfigError, match="max_queries"):
        get_protocol("search_r1", max_queries=2)
    with pytest.raises(ConfigError, match="max_query_chars must be a positive integer"):
        get_protocol("search_r1", max_query_chars=0)
    with pytest.raises(ConfigError, match="max_queries must be a positive integer"):
        RagR1Protocol(max_queries=0)


def test_baseline_prompts():
    direct = direct_messages("Who directed Jaws?")
    assert direct[-1]["content"] == "Question: Who directed Jaws?"
    assert "few words" in direct[0]["content"] and "<answer>" not in direct[0]["content"]
    rag = naive_rag_messages("Who directed Jaws?", [JAWS, ALIEN])[-1]["content"]
    assert rag.index('Doc 1 (Title: "Jaws (film)")') < rag.index('Doc 2 (Title: "Alien (film)")') < rag.index("Question:")
    assert baseline_answer("\n  Answer:  Steven Spielberg\nmore") == "Steven Spielberg"
    assert baseline_answer("") == ""
    with pytest.raises(RagrlError):
        naive_rag_messages("", [JAWS])
