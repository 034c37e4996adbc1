"""candidates_map, by hand: which runs of a comparison become points, how the judged set is named, and
when both search conditions hold; the method comes from each run's committed config."""
from experiments.search_agents.candidates_map import both_hold, points, question_set, run_methods


def _rec(mean, lo, hi):
    return {"mean": mean, "ci_lo": lo, "ci_hi": hi}


def _compare(questions):
    return {"meta": {"questions": questions},
            "rows": {"naive_rag": {"search_gain": _rec(0, 0, 0)},
                     "learn_x (start)": {"search_gain": _rec(-15.0, -18.0, -12.0)},
                     "learn_x": {"search_gain": _rec(-2.0, -4.0, 0.5), "format_error_rate": 0.04},
                     "diag": {"search_gain": _rec(1.0, 0.0, 2.0)},
                     "learn_y": {"search_gain": None}},
            "vs_start": {"learn_x": {"search_gain": {"diff": 13.0, "ci_lo": 9.0, "ci_hi": 17.0}},
                         "diag": {"search_gain": {"diff": 1.0, "ci_lo": 0.5, "ci_hi": 1.5}},
                         "learn_y": {"search_gain": {"diff": 0.0, "ci_lo": 0.0, "ci_hi": 0.0}}}}


def test_points_keep_the_candidates_with_both_figures():
    pts = points(_compare("803: kit:eval/hotpotqa_dev.jsonl.gz (all)"), {"learn_x": "Search-R1", "learn_y": "RAG-R1"})
    assert [p["run"] for p in pts] == ["learn_x"]          # diag has no config; learn_y no own search gain
    p = pts[0]
    assert p["questions"] == "eval/ (803)" and p["start"]["mean"] == -15.0 and abs(p["format_errors"] - 4.0) < 1e-9
    assert not both_hold(p)                                 # a large Δ, but its searches lose to the question
    assert both_hold({**p, "own": _rec(0.0, -2.0, 2.0)})    # own exactly 0 counts as "at least"
    assert not both_hold({**p, "own": _rec(3.0, 1.0, 5.0), "delta": {"diff": 2.0, "ci_lo": 0.0, "ci_hi": 4.0}})


def test_question_set_names_held_apart_and_eval():
    assert question_set("364: agent-confirm (first 364)") == "held-apart train/ (364)"
    assert question_set("803: kit:eval/hotpotqa_dev.jsonl.gz, kit:eval/musique_dev.jsonl.gz") == "eval/ (803)"


def test_run_methods_read_the_recipe_name(tmp_path):
    (tmp_path / "learn_q_config.yaml").write_text("name: search_r1_grpo\nseed: 0\n")
    (tmp_path / "learn_rs_config.yaml").write_text("seed: 0\nname: r1_searcher_stage2\n")
    (tmp_path / "learn_h_config.yaml").write_text("name: harr\n")              # not an LM method of #53
    assert run_methods(tmp_path) == {"learn_q": "Search-R1", "learn_rs": "R1-Searcher"}
