"""QA datasets: JSON Lines (optionally gzip) rows with `id`, `question`, `answers`."""
from __future__ import annotations

from pathlib import Path

from ragrl.errors import RagrlError
from ragrl.jsonl import iter_json_objects
from ragrl.paths import DEMO_EVAL, DEMO_TRAIN, POOL_DEV, POOL_TRAIN, SMARTRAG_DEV, SMARTRAG_TRAIN, resolve_kit

ALIASES = {"demo-train": DEMO_TRAIN, "demo-eval": DEMO_EVAL, "pool-train": POOL_TRAIN, "pool-dev": POOL_DEV,
           "smartrag-train": SMARTRAG_TRAIN, "smartrag-dev": SMARTRAG_DEV}


def resolve_data(path: str | Path) -> Path:
    """`demo-train` / `demo-eval` / `pool-train` / `pool-dev` / `smartrag-train` / `smartrag-dev`
    name the bundled splits; `kit:eval/…`
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
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise RagrlError(f"{p}: cannot read ({e})") from None
    rows: list[dict] = []
    for ln, row in iter_json_objects(raw, str(p)):
        # FlashRAG's JSONL names the gold answers `golden_answers`.
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
