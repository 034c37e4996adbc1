"""QA datasets: JSON Lines (optionally gzip) rows with `id`, `question`, `answers`."""
from __future__ import annotations

import re
from pathlib import Path

from ragrl.errors import RagrlError
from ragrl.jsonl import iter_json_objects
from ragrl.paths import (
    AGENT_CONFIRM,
    AGENT_DEV,
    DEMO_EVAL,
    DEMO_TRAIN,
    MULTIHOP_DEV,
    MULTIHOP_TRAIN,
    POOL_DEV,
    POOL_TRAIN,
    SMARTRAG_DEV,
    SMARTRAG_TRAIN,
    resolve_kit,
)

ALIASES = {"demo-train": DEMO_TRAIN, "demo-eval": DEMO_EVAL, "pool-train": POOL_TRAIN, "pool-dev": POOL_DEV,
           "smartrag-train": SMARTRAG_TRAIN, "smartrag-dev": SMARTRAG_DEV,
           "multihop-train": MULTIHOP_TRAIN, "multihop-dev": MULTIHOP_DEV, "agent-dev": AGENT_DEV,
           "agent-confirm": AGENT_CONFIRM}


def resolve_data(path: str | Path) -> Path:
    """`demo-train` / `demo-eval` / `pool-train` / `pool-dev` / `smartrag-train` / `smartrag-dev` /
    `multihop-train` / `multihop-dev` / `agent-dev` / `agent-confirm` name the bundled splits; `kit:eval/…`
    a file of the data kit (ragrl.paths.data_kit); anything else is a file path."""
    p = ALIASES.get(str(path)) or resolve_kit(path)
    if not Path(p).exists():
        raise RagrlError(f"question file not found: {path} (or use one of: {', '.join(ALIASES)})")
    return Path(p)


def load_questions(path: str | Path, limit: int | None = None) -> list[dict]:
    """Read QA rows; a malformed row fails with the file and line number.

    >>> rows = load_questions("demo-eval", limit=2)
    >>> sorted(rows[0])[:3], len(rows)
    (['answers', 'context_passage_ids', 'dataset'], 2)
    """
    p = resolve_data(path)
    rows: list[dict] = []
    for ln, row in _rows(p):
        # FlashRAG's JSONL names the gold answers `golden_answers`; Search-R1's / verl's parquet
        # keeps them in reward_model.ground_truth.target and the question inside its chat prompt.
        row = _from_verl(row)
        q, a = row.get("question"), row.get("answers", row.get("golden_answers", row.get("answer")))
        if isinstance(a, str):
            a = [a]
        if not isinstance(q, str) or not q.strip():
            raise RagrlError(f'{p}:{ln}: missing or empty "question"')
        if not isinstance(a, list) or not a or not all(isinstance(x, str) for x in a):
            raise RagrlError(f'{p}:{ln}: "answers" (or "golden_answers") must be a non-empty list of strings')
        row["answers"] = a
        row.setdefault("id", f"{p.stem}-{ln}")
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise RagrlError(f"{p}: no questions")
    return rows


def with_heuristic_gold(rows: list[dict]) -> list[dict]:
    """Rows with no `gold_passage_ids` but the kit's `evidence_passage_ids_heuristic` (2Wiki: the
    entity's passage and the nearby passage that holds the answer) take those as gold passages,
    marked `"gold_source": "heuristic_evidence"`, so recall over them is never mistaken for recall
    of official supporting passages. Other rows are returned unchanged.

    >>> with_heuristic_gold([{"id": "a", "evidence_passage_ids_heuristic": ["p1", "p2"]}, {"id": "b"}])
    [{'id': 'a', 'evidence_passage_ids_heuristic': ['p1', 'p2'], 'gold_passage_ids': ['p1', 'p2'], 'gold_source': 'heuristic_evidence'}, {'id': 'b'}]
    """
    return [dict(r, gold_passage_ids=list(r["evidence_passage_ids_heuristic"]), gold_source="heuristic_evidence")
            if not r.get("gold_passage_ids") and r.get("evidence_passage_ids_heuristic") else r for r in rows]


def _rows(p: Path):
    """(line or row number, dict) from JSON Lines (.gz too), a parquet file, or a Hugging Face
    `datasets` directory saved with save_to_disk (its *.arrow files)."""
    if p.is_dir():
        files = sorted(p.glob("**/*.arrow")) or sorted(p.glob("**/*.parquet"))
        if not files:
            raise RagrlError(f"{p}: a directory with no .arrow or .parquet files (not a saved dataset)")
        n = 0
        for f in files:
            for _, row in _rows(f):
                n += 1
                yield n, row
        return
    if p.suffix in (".parquet", ".arrow"):
        try:
            import pyarrow.ipc  # late: only .parquet/.arrow question files need pyarrow (~0.3 s to import)
            import pyarrow.parquet  # late: as above
        except ImportError:
            raise RagrlError(f"{p}: reading {p.suffix} files needs pyarrow (pip install pyarrow)") from None
        try:
            if p.suffix == ".parquet":
                table = pyarrow.parquet.read_table(p)
            else:
                with open(p, "rb") as f:
                    try:
                        table = pyarrow.ipc.open_stream(f).read_all()
                    except Exception:
                        f.seek(0)
                        table = pyarrow.ipc.open_file(f).read_all()
        except Exception as e:   # pyarrow raises several kinds for a bad file
            raise RagrlError(f"{p}: not a readable {p.suffix} file ({type(e).__name__}: {str(e)[:200]})") from None
        for i, row in enumerate(table.to_pylist(), 1):
            yield i, row
        return
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise RagrlError(f"{p}: cannot read ({e})") from None
    yield from iter_json_objects(raw, str(p))


_QUESTION_IN_PROMPT = re.compile(r"Question:\s*(.+?)\s*(?:\n|$)", re.S)


def _from_verl(row: dict) -> dict:
    r"""Search-R1 / verl rows: answers from reward_model.ground_truth.target, the question from
    `question` or else the last `Question:` line of the user prompt.

    >>> _from_verl({"prompt": [{"role": "user", "content": "Answer... Question: Who wrote Jaws?\n"}],
    ...             "reward_model": {"ground_truth": {"target": ["Peter Benchley"]}}, "data_source": "nq"})["answers"]
    ['Peter Benchley']
    """
    gt = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
    if not isinstance(gt, dict) or "answers" in row or "golden_answers" in row:
        return row
    target = gt.get("target")
    row = dict(row, answers=[target] if isinstance(target, str) else list(target or []))
    if not row.get("question") and isinstance(row.get("prompt"), list):
        user = " ".join(m.get("content", "") for m in row["prompt"] if isinstance(m, dict) and m.get("role") == "user")
        found = _QUESTION_IN_PROMPT.findall(user)
        if found:
            row["question"] = found[-1]
    row.setdefault("dataset", row.get("data_source"))
    return row
