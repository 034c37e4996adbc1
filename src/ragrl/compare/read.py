"""Reading a `ragrl compare` folder back: its questions grouped by set, and each system's episodes.

`ragrl compare` pools every `--data` file into one table; a result measured on several `eval/` files is
reported per set too, and pooled. The scripts that report so (issue #53's per-set tables, issue #58's
ablations) read the folder through these two functions, so a set is grouped, and a system's file named,
one way.
"""
from __future__ import annotations

import json
from pathlib import Path

from ragrl.errors import RagrlError
from ragrl.eval.report import file_stem, load_trajectories
from ragrl.rollout.trajectory import Trajectory

POOLED = "pooled"


def question_sets(folder: str | Path) -> dict[str, list[str]]:
    """{set name: question ids} from the folder's questions.jsonl, in file order, one entry per
    `dataset` and a last one, "pooled", with every question.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "questions.jsonl").write_text('{"id": 1, "dataset": "hotpotqa"}\\n{"id": "b", "dataset": "musique"}\\n'
    ...                                         '{"id": 3, "dataset": "hotpotqa"}\\n')
    >>> question_sets(d)
    {'hotpotqa': ['1', '3'], 'musique': ['b'], 'pooled': ['1', 'b', '3']}
    """
    path = Path(folder) / "questions.jsonl"
    if not path.is_file():
        raise RagrlError(f"{path} is missing: is {folder} a `ragrl compare` output folder?")
    questions = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    sets: dict[str, list[str]] = {}
    for q in questions:
        if q.get("dataset") == POOLED:
            raise RagrlError(f"{path}: a question's dataset is named {POOLED!r}, the name of all questions together")
        sets.setdefault(str(q.get("dataset", "?")), []).append(str(q["id"]))
    sets[POOLED] = [str(q["id"]) for q in questions]
    return sets


def episodes(folder: str | Path, system: str) -> dict[str, Trajectory]:
    """{question id: answering episode} of one system in the folder, its file named as `ragrl compare`
    names it (a run's start is the system "<run> (start)")."""
    path = Path(folder) / f"trajectories_{file_stem(system)}.jsonl"
    if not path.is_file():
        raise RagrlError(f"{path} is missing: {folder} holds no episodes of the system {system!r}")
    return {t.sample_id: t for t in load_trajectories(path)}
