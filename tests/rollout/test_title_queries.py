"""`rollout.second_query: title`: the second search's query is one of the titles the episode read,
with the real SmolLM2 sampling under the constraint over a real BM25 index of the demo corpus."""
from __future__ import annotations

import pytest

from ragrl.datasets import load_questions
from ragrl.engines.hf import HFEngine
from ragrl.errors import ConfigError, RagrlError
from ragrl.paths import DEMO_EVAL
from ragrl.retrieval.inprocess import InProcessRetriever
from ragrl.rollout.config import RolloutConfig, check_forced_turns, evaluation_key
from ragrl.rollout.multi_turn import run_episodes
from ragrl.rollout.protocol import get_protocol
from ragrl.rollout.title_queries import QueryTrie, TitleGazetteer, fallback_query, gazetteer_of, title_candidates

import ragrl.methods  # noqa: F401  (registers the search_r1 protocol)

SHAPE = dict(first_action="question", second_action="search", last_action="answer", max_turns=3,
             end_after_searches=2, topk=3, passage_words=30, max_turn_tokens=40, max_response_tokens=400)


class RecordingRetriever(InProcessRetriever):
    """The real in-process retriever, recording every (query, k) it is asked for."""

    def __init__(self, index):
        super().__init__(index)
        self.asked: list[tuple[str, int]] = []

    def search(self, queries, k):
        self.asked += [(q, k) for q in queries]
        return super().search(queries, k)


def episodes(smollm2_policy, index, second_query: str, questions: int, n: int, title_group: str = "sample",
             title_fallback: str = "none"):
    """Real episodes of SmolLM2 over the demo index under `second_query` (tokenizer, retriever that
    records its searches, episodes, their config, the retriever's gazetteer)."""
    model, tok = smollm2_policy
    retriever = RecordingRetriever(index)
    cfg = RolloutConfig(**SHAPE, second_query=second_query, n=n, temperature=1.3, seed=3, title_group=title_group,
                        title_fallback=title_fallback)
    trajs, _ = run_episodes(HFEngine(model, tok), get_protocol("search_r1"), retriever,
                            load_questions(DEMO_EVAL, limit=questions), cfg)
    return tok, retriever, trajs, cfg, gazetteer_of(retriever)


def test_every_second_query_is_a_title_the_episode_read(smollm2_policy, demo_bm25_index):
    tok, _, trajs, _, gazetteer = episodes(smollm2_policy, demo_bm25_index, "title", questions=6, n=4)
    constrained = 0
    for t in trajs:
        titles = title_candidates(gazetteer, t)
        second = t.turns[1]
        if titles:   # (the base model's free queries, where there is no title, may not even parse)
            constrained += 1
            assert second.kind == "search", second.action_text
            assert second.queries[0] in titles, (second.queries, titles)
            # The policy's tokens of that turn are exactly the title's, as the SFT episodes write them.
            start = len(t.token_ids) - len(tok.encode(f" {second.queries[0]} </search>", add_special_tokens=False))
            assert t.token_ids[start:] == tok.encode(f" {second.queries[0]} </search>", add_special_tokens=False)
            assert all(t.action_mask[start:])
    assert constrained >= 12, f"only {constrained} of {len(trajs)} episodes had titles to choose from"
    # Samples of one question choose different titles somewhere: the constraint leaves a choice.
    groups = {}
    for t in trajs:
        if title_candidates(gazetteer, t):
            groups.setdefault(t.group, set()).add(t.turns[1].queries[0])
    assert any(len(q) > 1 for q in groups.values()), groups


def test_free_second_query_is_unconstrained_and_the_cache_key_tells_them_apart(smollm2_policy, demo_bm25_index):
    assert "second_query" not in evaluation_key(RolloutConfig(**SHAPE))
    assert evaluation_key(RolloutConfig(**SHAPE, second_query="title"))["second_query"] == "title"
    assert evaluation_key(RolloutConfig(**SHAPE, second_query="question_title"))["second_query"] == "question_title"


def test_question_title_searches_the_question_then_the_chosen_title(smollm2_policy, demo_bm25_index):
    """The policy writes only a title (its tokens are the title's), and the runner searches the
    question followed by it: the turn's passages are the index's own top k for that query."""
    tok, retriever, trajs, cfg, gazetteer = episodes(smollm2_policy, demo_bm25_index, "question_title",
                                                     questions=4, n=2)
    constrained = 0
    for t in trajs:
        titles = title_candidates(gazetteer, t)
        if not titles:
            continue
        constrained += 1
        second = t.turns[1]
        [query] = second.queries
        assert query.startswith(t.question + " ") and query[len(t.question) + 1:] in titles, query
        written = tok.encode(f" {query[len(t.question) + 1:]} </search>", add_special_tokens=False)
        assert t.token_ids[-len(written):] == written and all(t.action_mask[-len(written):])
        [hits] = retriever.search([query], cfg.topk)
        assert second.passage_ids == [[h.id for h in hits]]
    assert constrained >= 4, f"only {constrained} of {len(trajs)} episodes had titles to choose from"


def test_an_enumerated_group_takes_each_candidate_title_once(smollm2_policy, demo_bm25_index):
    """title_group: every: a question's episodes take its candidate titles one each, in sorted order
    (the first n), the episodes left over are dropped, and each records the model's own log-probs of
    the title it was given, which the enumerated estimator weighs them by."""
    n = 3
    tok, _, trajs, _, gazetteer = episodes(smollm2_policy, demo_bm25_index, "question_title", questions=6, n=n,
                                           title_group="every")
    groups: dict[int, list] = {}
    for t in trajs:
        groups.setdefault(t.group, []).append(t)
    assert sorted(groups) == list(range(6))          # every question keeps at least one episode
    enumerated = 0
    for mine in groups.values():
        titles = title_candidates(gazetteer, mine[0])
        assert len(mine) == max(1, min(len(titles), n)), (len(mine), titles)
        for t in mine:
            assert t.metrics["scalars"]["title_candidates"] == len(titles)
            assert t.metrics["scalars"]["title_candidates_cut"] == float(len(titles) > n)
        if not titles:
            continue
        enumerated += len(titles) > 1
        chosen = [t.turns[1].queries[0][len(t.question) + 1:] for t in mine]
        assert chosen == titles[:n]
        logps = []
        for t in mine:
            written = tok.encode(f" {t.turns[1].queries[0][len(t.question) + 1:]} </search>", add_special_tokens=False)
            assert t.token_ids[-len(written):] == written and all(t.action_mask[-len(written):])
            logps.append(sum(t.logprobs[-len(written):]))
        assert all(lp < 0 for lp in logps) and len(set(logps)) == len(logps), logps
    assert enumerated >= 1, "the demo questions gave no choice to enumerate"


def test_title_notes_list_each_candidate_with_its_first_sentence_before_the_choice(smollm2_policy, demo_bm25_index):
    """title_notes: first_sentence: the second search's thought lists the episode's candidates, each
    with the first sentence of its page, out of every loss, and the query written is still one of them;
    without candidates the thought is the plain one. The cache key tells the two apart."""
    model, tok = smollm2_policy
    retriever = InProcessRetriever(demo_bm25_index)
    protocol = get_protocol("search_r1")
    samples = load_questions(DEMO_EVAL, limit=4)
    cfg = RolloutConfig(**SHAPE, second_query="title", title_notes="first_sentence", temperature=0.0)
    trajs, _ = run_episodes(HFEngine(model, tok), protocol, retriever, samples, cfg)
    plain, _ = run_episodes(HFEngine(model, tok), protocol, retriever, samples,
                            RolloutConfig(**SHAPE, second_query="title", temperature=0.0))
    gazetteer = gazetteer_of(retriever)
    noted = 0
    for t, p in zip(trajs, plain):
        titles = title_candidates(gazetteer, t)
        text = tok.decode(t.token_ids[t.prompt_len:])
        if not titles:
            assert "Titles I can search" not in text
            continue
        noted += 1
        assert t.turns[1].queries[0] in titles
        for title in titles[:12]:
            line = f"- {title}: {gazetteer.note(title)}" if gazetteer.note(title) else f"- {title}"
            assert line in text, (line, text)
        # The notes are the runner's tokens: the policy's are only the title it chose, and the episode
        # is longer than the plain one by the notes alone.
        written = tok.encode(f" {t.turns[1].queries[0]} </search>", add_special_tokens=False)
        assert sum(t.action_mask) == len(written) and t.token_ids[-len(written):] == written
        assert len(t.token_ids) > len(p.token_ids)
    assert noted >= 2, "the demo questions gave no candidate to note"
    assert evaluation_key(cfg)["title_notes"] == "first_sentence"
    assert "title_notes" not in evaluation_key(RolloutConfig(**SHAPE, second_query="title"))


def test_the_question_fallback_is_enumerated_first_and_served_as_the_questions_next_passages(
        smollm2_policy, demo_bm25_index):
    """title_fallback: question under an enumerated group: each question's first episode writes the
    question itself (its tokens the policy's, with a log-prob) and is shown the question's BM25 ranks
    k+1..2k, so the episode shows naive RAG's top 2k; the others take the titles, as without it."""
    n = 4
    tok, retriever, trajs, cfg, gazetteer = episodes(smollm2_policy, demo_bm25_index, "title", questions=6, n=n,
                                                     title_group="every", title_fallback="question")
    # The fallback question is searched once as a next page (k + shown rows), never again at top k:
    # each of the group's n first searches asks for it at top k (a group is cut to its candidates only
    # after them), and the page once.
    asked = list(retriever.asked)
    groups: dict[int, list] = {}
    for t in trajs:
        groups.setdefault(t.group, []).append(t)
    assert sorted(groups) == list(range(6))
    for mine in groups.values():
        question = fallback_query(mine[0].question)
        assert sorted(k for q, k in asked if q == question) == [cfg.topk] * n + [2 * cfg.topk], question
    for mine in groups.values():
        titles = title_candidates(gazetteer, mine[0])
        assert len(mine) == min(len(titles) + 1, n), (len(mine), titles)
        question = fallback_query(mine[0].question)
        assert [t.turns[1].queries[0] for t in mine] == [question] + titles[: n - 1]
        first = mine[0]
        written = tok.encode(f" {question} </search>", add_special_tokens=False)
        assert first.token_ids[-len(written):] == written and all(first.action_mask[-len(written):])
        assert sum(first.logprobs[-len(written):]) < 0
        [top] = retriever.search([question], 2 * cfg.topk)
        shown = first.turns[0].passage_ids[0] + first.turns[1].passage_ids[0]
        assert shown == [h.id for h in top], (shown, [h.id for h in top])
        for t in mine[1:]:   # a title is searched as itself, the index's own top k for it
            [hits] = retriever.search([t.turns[1].queries[0]], cfg.topk)
            assert t.turns[1].passage_ids == [[h.id for h in hits]]


def test_a_sampled_second_query_with_the_fallback_is_the_question_or_a_title(smollm2_policy, demo_bm25_index):
    """Sampled (title_group: sample), every second query is the question or one of the titles, a question
    with no title included (it searches the question rather than writing freely), and the cache key
    holds the setting only when it is set."""
    _, _, trajs, cfg, gazetteer = episodes(smollm2_policy, demo_bm25_index, "title", questions=6, n=4,
                                           title_fallback="question")
    chose = set()
    for t in trajs:
        options = [fallback_query(t.question)] + title_candidates(gazetteer, t)
        assert t.turns[1].kind == "search" and t.turns[1].queries[0] in options, (t.turns[1].queries, options)
        chose.add(t.turns[1].queries[0] == options[0])
    assert chose == {True, False}, "the samples never chose between the question and a title"
    assert evaluation_key(cfg)["title_fallback"] == "question"
    assert "title_fallback" not in evaluation_key(RolloutConfig(**SHAPE, second_query="title"))


def test_the_fallback_needs_a_constrained_second_query():
    with pytest.raises(ConfigError, match="title_fallback=question adds a candidate"):
        check_forced_turns(RolloutConfig(**SHAPE, title_fallback="question"))


def test_title_notes_need_a_constrained_second_query():
    with pytest.raises(ConfigError, match="title_notes=first_sentence notes the candidate titles"):
        check_forced_turns(RolloutConfig(**SHAPE, title_notes="first_sentence"))


def test_title_group_every_needs_a_constrained_second_query():
    with pytest.raises(ConfigError, match="title_group=every"):
        check_forced_turns(RolloutConfig(**SHAPE, title_group="every"))
    assert "title_group" not in evaluation_key(RolloutConfig(**SHAPE, second_query="title", title_group="every"))


def test_a_retriever_that_lists_no_titles_is_refused_before_any_turn(smollm2_policy):
    model, tok = smollm2_policy

    class Remote:   # like the HTTP client: searches, cannot list the corpus
        def search(self, queries, k):
            raise AssertionError("no search may run")

    cfg = RolloutConfig(**SHAPE, second_query="title")
    with pytest.raises(ConfigError, match="lists its corpus's titles"):
        run_episodes(HFEngine(model, tok), get_protocol("search_r1"), Remote(), [{"id": 0, "question": "q?",
                                                                                  "answers": ["a"]}], cfg)


def test_second_query_title_needs_the_forced_second_search():
    with pytest.raises(ConfigError, match="second_action"):
        check_forced_turns(RolloutConfig(**{**SHAPE, "second_action": "free"}, second_query="title"))


def test_candidates_leave_out_what_the_first_search_showed():
    from ragrl.rollout.trajectory import Trajectory, Turn

    g = TitleGazetteer(["Paris", "France", "Eiffel Tower", "Gustave Eiffel"])
    t = Trajectory(sample_id="0", question="Who built the Eiffel Tower?", golds=["Gustave Eiffel"],
                   token_ids=[1], action_mask=[0], logprobs=[0.0], prompt_len=1)
    t.turns.append(Turn(action_text="", kind="search", queries=[t.question], passage_titles=[["Eiffel Tower"]],
                        observation="The Eiffel Tower in Paris was designed by the company of Gustave Eiffel."))
    assert title_candidates(g, t) == ["Gustave Eiffel", "Paris"]


def test_the_trie_refuses_a_prefix_off_its_sequences():
    trie = QueryTrie([[1, 2], [1, 3]])
    assert trie([1]) == [2, 3]
    with pytest.raises(RagrlError, match="went past its titles"):
        trie([1, 2])
    with pytest.raises(RagrlError):
        QueryTrie([])
