"""Which systems a comparison runs: the baselines, then each run's start and trained policy."""
from __future__ import annotations

from pathlib import Path

from ragrl.compare.runs import RunRecord, SearchSetting
from ragrl.compare.systems import systems_for

SETTING = SearchSetting(Path("c"), "s", "bm25", "i")


def _run(label: str, evaluation: str = "agent") -> RunRecord:
    return RunRecord(Path(label), label, None, None, evaluation, Path(label) / "final_adapter",
                     Path(label) / "sft" / "adapter", SETTING)


def test_each_run_brings_its_start_unless_left_out():
    runs = [_run("a"), _run("b", "pipeline"), _run("h", "retriever")]
    assert [(s.name, s.role, s.kind) for s in systems_for(runs)] == [
        ("direct", "baseline", "direct"), ("naive_rag", "baseline", "naive_rag"),
        ("a (start)", "start", "agent"), ("a", "trained", "agent"), ("b (start)", "start", "pipeline"),
        ("b", "trained", "pipeline"), ("h (start)", "start", "retriever"), ("h", "trained", "retriever")]
    assert [s.name for s in systems_for(runs, skip_start=frozenset({"b"}))][2:] == ["a (start)", "a", "b", "h (start)", "h"]
    assert [s.name for s in systems_for(runs, with_start=False)] == ["direct", "naive_rag", "a", "b", "h"]
    start = systems_for(runs)[2]
    assert start.artifact == Path("a/sft/adapter") and systems_for(runs)[3].artifact == Path("a/final_adapter")
