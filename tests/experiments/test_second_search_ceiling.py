"""second_search_ceiling.second_queries: what each episode's second query names, by hand-made episodes;
an episode whose question has no gold passage ids is counted as left out, not dropped silently, and a
query of the question followed by a title (second_query: question_title) is read as that title, and one
that is the question itself (title_fallback: question) is sorted apart and counted over every episode."""
import json

from experiments.search_agents.second_search_ceiling import second_queries

TITLES = {"p1": "Alpha", "p2": "Beta", "p3": "Gamma", "p9": "Other"}


def episode(sid: str, second_query: str, gain: float) -> dict:
    return {"sample_id": sid, "question": "The question?", "metrics": {"search_gain": gain},
            "turns": [{"queries": ["the question"], "passage_ids": [["p1", "p9"]]},
                      {"queries": [second_query], "passage_ids": [["p2"]]}]}


def test_second_queries_sorts_by_what_they_name_and_counts_questions_without_gold(tmp_path):
    path = tmp_path / "trajectories_agent.jsonl"
    rows = [episode("a", "Beta", 1.0),      # names the gold title the first search missed
            episode("b", "other", 0.0),     # a title it was shown (normalised)
            episode("c", "something", -1.0),
            episode("d", "The question  Beta", 1.0),   # question_title: the question, then the gold title
            episode("e", "The question?", 0.0),        # title_fallback: the question itself
            episode("m", "The question?", 0.0)]        # its question has no gold ids
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    questions = {sid: {"question": "The question?", "gold_passage_ids": ["p1", "p2"]} for sid in "abcde"}
    out = second_queries(path, questions, TITLES.__getitem__)
    assert out["episodes_with_two_searches"] == 5 and out["left_out_without_gold_ids"] == 1
    assert out["missed gold title"] == {"share": 40.0, "search_gain": 100.0}
    assert out["title it was shown"] == {"share": 20.0, "search_gain": 0.0}
    assert out["the question"] == {"share": 20.0, "search_gain": 0.0}
    assert out["neither"] == {"share": 20.0, "search_gain": -100.0}
    assert out["second_query_is_the_question_all_episodes"] == round(100 * 2 / 6, 1)
