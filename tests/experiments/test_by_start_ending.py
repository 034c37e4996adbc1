"""experiments/leaderboard/by_start_ending.py: a run against its start, split by how the start's episode ended."""
from __future__ import annotations

import json

import pytest

from experiments.leaderboard.by_start_ending import by_start_ending, table


def write(folder, name, rows):
    (folder / f"trajectories_{name}.jsonl").write_text("\n".join(
        json.dumps({"sample_id": i, "metrics": {"f1": f}, "stop_reason": stop, "answer": answer})
        for i, (f, stop, answer) in rows.items()))


def test_the_gain_is_split_by_the_starts_ending_and_paired_within_each_group(tmp_path):
    write(tmp_path, "r_start", {"a": (0.5, "answer", "two words"), "b": (1.0, "answer", "one"),
                                "c": (0.0, "max_turns", None)})
    write(tmp_path, "r", {"a": (0.5, "answer", "x"), "b": (0.0, "answer", "y z w"), "c": (1.0, "answer", "Paris")})
    result = by_start_ending(tmp_path, "r")
    assert list(result) == ["answer", "max_turns", "all"]
    assert result["answer"]["n"] == 2 and result["answer"]["f1"]["run - start"]["diff"] == -50.0
    assert result["max_turns"]["f1"]["run - start"]["diff"] == 100.0 and result["max_turns"]["run answered %"] == 100.0
    # words are counted over the answers given; the start's unanswered episode has none
    assert result["answer"]["answer words"] == {"start": 1.5, "run": 2.0}
    assert result["max_turns"]["answer words"] == {"start": None, "run": 1.0}
    assert result["all"]["f1"]["run - start"]["diff"] == pytest.approx(100 * (0 - 1.0 + 1.0) / 3)
    lines = table(result)
    assert len(lines) == 2 + 3 and lines[3].startswith("| max_turns | 1 |")


def test_a_run_and_start_over_different_questions_are_refused(tmp_path):
    write(tmp_path, "r_start", {"a": (0.5, "answer", "x")})
    write(tmp_path, "r", {"b": (0.5, "answer", "x")})
    with pytest.raises(SystemExit, match="different questions"):
        by_start_ending(tmp_path, "r")
