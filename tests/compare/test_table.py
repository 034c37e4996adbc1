"""The comparison's table on hand-built systems: paired differences, searches, break-even cost, verdicts."""
from __future__ import annotations

from pathlib import Path

import pytest

from ragrl.compare.runs import RunRecord, SearchSetting
from ragrl.compare.systems import System
from ragrl.compare.table import build_table, markdown
from ragrl.rollout.trajectory import Trajectory


def _system_trajs(f1s, ems, searches):
    out = []
    for i, (f1, em, s) in enumerate(zip(f1s, ems, searches)):
        t = Trajectory(sample_id=f"q{i}", question=f"question {i}", golds=["a"], token_ids=[1], action_mask=[0],
                       logprobs=[0.0], prompt_len=1, answer="a" if em else "b", num_searches=s)
        t.metrics = {"em": em, "f1": f1, "cover_em": em, "searches": s, "gen_tokens": 10 * (s + 1),
                     "answer_shown": 1.0 if s else 0.0, "gold_shown": None,
                     "payoff": [{"new_gold": 0, "new_answer": j == 0, "paid": j == 0} for j in range(s)]}
        out.append(t)
    return out


@pytest.fixture
def table():
    run = RunRecord(path=Path("runs/x"), label="x", cfg=None, method=None, evaluation="agent",
                    trained=Path("runs/x/final_adapter"), start=Path("runs/x/sft/adapter"),
                    search=SearchSetting(Path("corpus.jsonl"), "abc", "bm25", "bm25(corpus.jsonl)"))
    systems = [System("direct", "baseline"), System("naive_rag", "baseline"),
               System("x (start)", "start", run, run.start), System("x", "trained", run, run.trained)]
    results = {"direct": _system_trajs([0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]),
               "naive_rag": _system_trajs([0, 1, 0.5, 0], [0, 1, 0, 0], [1, 1, 1, 1]),
               "x (start)": _system_trajs([0, 0, 0.5, 0], [0, 0, 0, 0], [1, 0, 1, 0]),
               "x": _system_trajs([1, 1, 0.5, 0.5], [1, 1, 0, 0], [2, 2, 1, 1])}
    results = {k: {"trajectories": v, "wall_s": 2.0, "reused": None} for k, v in results.items()}
    return build_table(results, systems, train_times={"x": {"seconds": 600.0, "machine": "CPU", "how": "rl 10 min"}},
                       costs={"x": 0.2})


def test_paired_differences_match_the_hand_computed_case(table):
    # x - naive_rag per question: F1 [1, 0, 0, 0.5] -> +37.5 points; EM [1, 0, 0, 0] -> +25
    d = table["vs_baseline"]["x"]
    assert d["n_paired"] == 4
    assert d["f1"]["diff"] == pytest.approx(37.5) and d["em"]["diff"] == pytest.approx(25.0)
    assert d["f1"]["ci_lo"] <= 37.5 <= d["f1"]["ci_hi"]
    # x - its start: F1 [1, 1, 0, 0.5] -> +62.5, every resample but the rare all-zero one above 0
    s = table["vs_start"]["x"]
    assert s["f1"]["diff"] == pytest.approx(62.5) and s["f1"]["ci_lo"] > 0
    assert s["verdict"] == "better than its start"
    assert set(table["vs_baseline"]) == {"direct", "x (start)", "x"}


def test_rows_carry_every_column(table):
    row = table["rows"]["x"]
    assert row["f1"]["mean"] == pytest.approx(75.0)
    assert row["searches"]["mean"] == pytest.approx(1.5) and row["searches"]["ci_lo"] <= 1.5 <= row["searches"]["ci_hi"]
    assert row["tokens"]["mean"] == pytest.approx(25.0)
    assert row["seconds_per_q"] == pytest.approx(0.5)
    assert row["answer_shown"]["mean"] == pytest.approx(100.0)
    assert row["payoff"] == {"searches": 6, "paid": pytest.approx(400 / 6), "gold": 0.0, "answer": pytest.approx(400 / 6)}
    # against direct (F1 0): 0.75 F1 for 1.5 searches a question = 0.5 a search; its reward charged 0.2
    assert row["break_even_cost"] == pytest.approx(0.5) and row["cost_per_search"] == 0.2
    assert row["trained"]["seconds"] == 600.0 and table["rows"]["x (start)"]["trained"] is None
    md = markdown(table, {"questions": "4"})
    for column in ("EM", "F1", "cover-EM", "answer@shown", "searches/q", "tokens/q", "s/q", "trained for",
                   "break-even cost", "better than its start", "10.0 min (CPU)"):
        assert column in md


def test_a_run_worse_than_its_start_is_called_so():
    run = RunRecord(Path("runs/y"), "y", None, None, "agent", Path("a"), Path("b"), SearchSetting(Path("c"), "s", "bm25", "i"))
    systems = [System("naive_rag", "baseline"), System("y (start)", "start", run), System("y", "trained", run)]
    results = {"naive_rag": _system_trajs([0.5] * 6, [0] * 6, [1] * 6),
               "y (start)": _system_trajs([1] * 6, [1] * 6, [1] * 6), "y": _system_trajs([0] * 6, [0] * 6, [1] * 6)}
    table = build_table({k: {"trajectories": v, "wall_s": 1.0} for k, v in results.items()}, systems,
                        train_times={}, costs={})
    assert table["vs_start"]["y"]["verdict"] == "worse than its start"
    assert table["rows"]["y"]["break_even_cost"] is None          # no `direct` row to measure against
    assert "worse than its start" in markdown(table, {})


def test_search_gain_is_averaged_and_paired_against_the_start_by_hand():
    """search gain per question (answer@shown minus the question's own top N): start [0, -1, 1, None],
    trained [1, 0, 1, None] (None: a yes/no question, left out) -> start 0.0, trained +66.7 points,
    paired +66.7 over the 3 questions both score."""
    run = RunRecord(Path("runs/z"), "z", None, None, "agent", Path("a"), Path("b"), SearchSetting(Path("c"), "s", "bm25", "i"))
    systems = [System("naive_rag", "baseline"), System("z (start)", "start", run), System("z", "trained", run)]
    gains = {"naive_rag": [0.0, 0.0, 0.0, None], "z (start)": [0.0, -1.0, 1.0, None], "z": [1.0, 0.0, 1.0, None]}
    results = {}
    for name, g in gains.items():
        trajs = _system_trajs([0.5] * 4, [0] * 4, [1] * 4)
        for t, x in zip(trajs, g):
            t.metrics["search_gain"] = x
        results[name] = {"trajectories": trajs, "wall_s": 1.0}
    table = build_table(results, systems, train_times={}, costs={})
    assert table["rows"]["z (start)"]["search_gain"]["mean"] == pytest.approx(0.0)
    assert table["rows"]["z"]["search_gain"] == pytest.approx({"mean": 200 / 3, "ci_lo": table["rows"]["z"]["search_gain"]["ci_lo"],
                                                              "ci_hi": 100.0, "n": 3})
    d = table["vs_start"]["z"]["search_gain"]
    assert d["n"] == 3 and d["diff"] == pytest.approx(200 / 3) and d["ci_lo"] >= 0.0
    assert table["vs_baseline"]["z"]["search_gain"]["diff"] == pytest.approx(200 / 3)
    md = markdown(table, {})
    assert "search gain" in md and "+66.7 [" in md
