"""The RAG-R1 and MMOA-RAG ablations: each pair of arms differs in the one setting its rule names, and
their tables and verdicts, by hand, from small comparison folders written here."""
import json
from pathlib import Path

import pytest

from experiments.ablations import mmoa_joint, rag_r1_queries
from experiments.ablations.common import SEARCH_GAIN, axis_diff, axis_record, held_apart_markdown, keep_run_files
from ragrl.compare.train_runs import plan_arms
from ragrl.eval.report import write_trajectories
from ragrl.rollout.trajectory import Trajectory, Turn


def _only_difference(module, tmp_path) -> tuple[dict, set]:
    plans = dict(plan_arms(module.arms(tmp_path), tmp_path, variant="learn"))
    a, b = plans.values()
    assert a.model.init_adapter == b.model.init_adapter == str(tmp_path / "sft" / "adapter")
    assert a.steps == b.steps and a.seed == b.seed == 0
    differs = {k for k in vars(a) if getattr(a, k) != getattr(b, k)} - {"out_dir"}
    return plans, differs


def test_rag_r1_arms_differ_only_in_queries_per_search(tmp_path):
    plans, differs = _only_difference(rag_r1_queries, tmp_path)
    assert differs == {"rollout"}
    multi, single = plans[rag_r1_queries.MULTI].rollout, plans[rag_r1_queries.SINGLE].rollout
    assert (multi.max_queries_per_call, single.max_queries_per_call) == (3, 1)
    assert {k for k in vars(multi) if getattr(multi, k) != getattr(single, k)} == {"max_queries_per_call"}
    assert plans[rag_r1_queries.MULTI].steps == 40


def test_mmoa_arms_differ_only_in_the_frozen_agents(tmp_path):
    plans, differs = _only_difference(mmoa_joint, tmp_path)
    assert differs == {"frozen_agents"}
    assert plans[mmoa_joint.GENERATOR].frozen_agents == ["rewriter", "selector"]
    assert plans[mmoa_joint.JOINT].frozen_agents == [] and plans[mmoa_joint.JOINT].agent_adapters == "per_agent"


def _search(*queries):
    return Turn(action_text="", kind="search", queries=list(queries))


def _episode(qid, searches: list[Turn], gain=0.0, f1=0.0, **metrics):
    """An episode as `ragrl compare` writes it: its num_searches counts the queries searched."""
    turns = [*searches, Turn(action_text="", kind="answer")]
    return Trajectory(qid, "q", ["a"], [], [], [], 0, turns=turns, num_searches=sum(len(u.queries) for u in searches),
                      num_turns=len(turns), metrics={"em": f1, "f1": f1, "search_gain": gain, **metrics})


def _folder(tmp_path: Path, systems: dict[str, list[Trajectory]]) -> Path:
    ids = [t.sample_id for t in next(iter(systems.values()))]
    (tmp_path / "questions.jsonl").write_text("".join(json.dumps({"id": i, "dataset": "hotpotqa"}) + "\n" for i in ids))
    for name, trajs in systems.items():
        write_trajectories(tmp_path / f"trajectories_{name}.jsonl", trajs)
    return tmp_path


def test_rag_r1_table_counts_calls_turns_and_queries(tmp_path):
    ids = [f"q{i}" for i in range(4)]
    one_call = [_episode(i, [_search("a", "b", "c")], gain=0.1) for i in ids]       # 1 call of 3 queries, 2 turns
    two_calls = [_episode(i, [_search("a"), _search("b")]) for i in ids]           # 2 calls of 1 query, 3 turns
    folder = _folder(tmp_path, {"direct": [_episode(i, []) for i in ids], "naive_rag": two_calls,
                                "three_queries_start": two_calls, "three_queries": one_call, "one_query": two_calls})
    out = rag_r1_queries.ablation(folder)
    multi = out["sets"]["pooled"]["systems"][rag_r1_queries.MULTI]
    assert (multi["search_calls"]["mean"], multi["turns"]["mean"], multi["queries"]["mean"]) == (1.0, 2.0, 3.0)
    claim = out["sets"]["pooled"]["paired"][rag_r1_queries.CLAIM]
    assert claim["search_calls"]["diff"] == -1.0 and claim["turns"]["diff"] == -1.0 and claim["queries"]["diff"] == 1.0
    assert claim["search_gain"]["diff"] == pytest.approx(10.0)
    assert out["verdict"] == "reproduced in direction"


def test_mmoa_table_reads_the_selectors_f1_where_the_pipeline_has_one(tmp_path):
    ids = ["q0", "q1"]
    kept = {"selector_precision": 0.5, "selector_recall": 1.0}   # selector F1 2/3
    folder = _folder(tmp_path, {"direct": [_episode(i, []) for i in ids], "naive_rag": [_episode(i, []) for i in ids],
                                "joint_start": [_episode(i, [], f1=0.0, selector_precision=0.0, selector_recall=0.0) for i in ids],
                                "joint": [_episode(i, [], f1=1.0, **kept) for i in ids],
                                "generator_only": [_episode(i, [], f1=0.5, selector_precision=0.0, selector_recall=0.0)
                                                   for i in ids]})
    out = mmoa_joint.ablation(folder)
    pooled = out["sets"]["pooled"]
    assert pooled["systems"]["direct"]["selector_f1"] is None                   # no selector, no figure
    assert pooled["systems"][mmoa_joint.JOINT]["selector_f1"]["mean"] == pytest.approx(200 / 3)
    claim = pooled["paired"][mmoa_joint.CLAIM]
    assert claim["f1"]["diff"] == 50.0 and claim["selector_f1"]["diff"] == pytest.approx(200 / 3)
    assert out["verdict"] == "reproduced in direction"


def test_an_axis_no_episode_has_is_none_not_zero():
    eps = {"q0": _episode("q0", [], gain=None), "q1": _episode("q1", [], gain=None)}
    assert axis_record(eps, ["q0", "q1"], SEARCH_GAIN) is None
    assert axis_diff(eps, eps, ["q0", "q1"], SEARCH_GAIN) is None
    assert held_apart_markdown({"a": {20: {"f1": 7.0, "search_gain": None}}})[-1] == "| a | 20 | 7.00 | n/a |"


def test_the_files_the_results_cite_are_copied_beside_them_and_a_missing_one_fails(tmp_path):
    folder, out = tmp_path / "compare", tmp_path / "results" / "pair"
    folder.mkdir()
    out.parent.mkdir()
    (folder / "compare.md").write_text("| table |")
    (folder / "compare.json").write_text("{}")
    runs = {}
    for name in ("a", "b"):
        runs[name] = tmp_path / f"run_{name}"
        runs[name].mkdir()
        (runs[name] / "config.yaml").write_text(f"out_dir: {name}\n")
        (runs[name] / "metrics.jsonl").write_text(f'{{"step": 1, "arm": "{name}"}}\n')
    written = keep_run_files(out, folder, runs)
    assert sorted(p.name for p in written) == sorted(p.name for p in out.parent.iterdir()) == [
        "pair_a_config.yaml", "pair_a_metrics.jsonl", "pair_b_config.yaml", "pair_b_metrics.jsonl",
        "pair_compare.json", "pair_compare.md"]
    assert (out.parent / "pair_b_config.yaml").read_text() == "out_dir: b\n"   # each run's own file
    assert (out.parent / "pair_compare.md").read_text() == "| table |"
    (runs["b"] / "metrics.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        keep_run_files(out, folder, runs)
